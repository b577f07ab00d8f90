//! Fuzzing, with proptest (cargo-fuzz needs a nightly toolchain): the parsers that read what
//! others send, the webhook's signature verifier and delivery parser, the tenant registry's
//! reader and the readers of Slurm's output, get arbitrary input and mutations of the seeds in
//! `tests/fuzz-corpus/<target>/`. None may panic, and each keeps its properties (a correctly
//! signed body verifies, any 1-bit change does not; a stored body holds no NUL; a delivery
//! points at a bounded number of subjects; well-formed rows read back as written).
//!
//! Every seed runs every time, then `ONRAMP_FUZZ_CASES` generated cases per strategy (default
//! [`DEFAULT_CASES`]: about ten seconds for all targets on two cores; set it higher for a longer
//! run). A failing case is printed, shrunk: fix the parser and keep the input as a seed.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use onramp::backends::exec::Output;
use onramp::backends::slurm::parse;
use onramp::backends::slurm::{Fairshare, Limit, Tres};
use onramp::domain::tenants::TenantRegistry;
use onramp::flows::reconcile::Subject;
use onramp::intake::event;
use onramp::intake::{AuthFailure, AuthHeaders, SigningSecret, WebhookAuth};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::Value;

const DEFAULT_CASES: u32 = 4096;
const NOW: i64 = 1_764_460_800;
const KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const MAX_USERS: usize = 16;

fn runner() -> TestRunner {
    let cases = std::env::var("ONRAMP_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_CASES);
    TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() })
}

/// Runs `check` on `strategy`'s cases; a failure is reported with the shrunk input.
fn fuzz<S: Strategy>(strategy: S, check: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    if let Err(e) = runner().run(&strategy, check) {
        panic!("{e}");
    }
}

/// The seeds of a target, by file name.
fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-corpus").join(target);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|f| f.unwrap().path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no seeds in {}", dir.display());
    out
}

/// A seed with a few bytes replaced, inserted or removed (bytes from `alphabet`).
fn mutated(target: &str, alphabet: &'static [u8]) -> impl Strategy<Value = Vec<u8>> {
    let seeds: Vec<Vec<u8>> = seeds(target).into_iter().map(|(_, s)| s).collect();
    let edit = (any::<prop::sample::Index>(), 0..3u8, prop::sample::select(alphabet));
    (prop::sample::select(seeds), prop::collection::vec(edit, 1..8)).prop_map(|(mut s, edits)| {
        for (at, op, b) in edits {
            let i = if s.is_empty() { 0 } else { at.index(s.len()) };
            match op {
                0 if i < s.len() => s[i] = b,
                1 => s.insert(i, b),
                _ if i < s.len() => {
                    s.remove(i);
                }
                _ => s.push(b),
            }
        }
        s
    })
}

// ---- the signature verifier ----

fn auth() -> WebhookAuth {
    WebhookAuth {
        signing_secrets: vec![KEY.parse().unwrap()],
        bearer_tokens: vec![],
        tolerance: Duration::from_secs(300),
    }
}

fn verify(id: &str, ts: &str, sig: &str, body: &[u8]) -> Result<(), AuthFailure> {
    let h = AuthHeaders {
        webhook_id: Some(id),
        webhook_timestamp: Some(ts),
        webhook_signature: Some(sig),
        authorization: None,
    };
    auth().verify(&h, body, NOW).map(|_| ())
}

/// Signed, `body` verifies; with bit `bit` of the body, or of the signature, flipped it does not.
fn signed_then_flipped(body: &[u8], bit: usize) -> Result<(), TestCaseError> {
    let key: SigningSecret = KEY.parse().unwrap();
    let sig = key.sign("msg_1", NOW, body);
    prop_assert_eq!(verify("msg_1", &NOW.to_string(), &sig, body), Ok(()));
    if !body.is_empty() {
        let mut b = body.to_vec();
        let at = bit / 8 % b.len();
        b[at] ^= 1 << (bit % 8);
        prop_assert_eq!(verify("msg_1", &NOW.to_string(), &sig, &b), Err(AuthFailure::NoMatchingSignature));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut raw = b64.decode(&sig[3..]).unwrap();
    raw[bit / 8 % 32] ^= 1 << (bit % 8);
    let flipped = format!("v1,{}", b64.encode(&raw));
    prop_assert_eq!(verify("msg_1", &NOW.to_string(), &flipped, body), Err(AuthFailure::NoMatchingSignature));
    Ok(())
}

#[test]
fn fuzz_signature() {
    for (name, body) in seeds("signature") {
        // every bit of the seed (up to 8 KiB of bits, then spread out)
        let bits = body.len().max(32) * 8;
        for bit in (0..bits).step_by((bits / 8192).max(1)) {
            signed_then_flipped(&body, bit).unwrap_or_else(|e| panic!("seed {name}, bit {bit}: {e}"));
        }
    }
    fuzz((prop::collection::vec(any::<u8>(), 0..512), any::<usize>()), |(body, bit)| signed_then_flipped(&body, bit));
    // arbitrary headers never verify (nor panic)
    let header = prop_oneof![".{0,300}", "v1,[A-Za-z0-9+/=]{0,60}( v1,[A-Za-z0-9+/=]{0,60}){0,3}", "[ -~]{0,80}"];
    fuzz((header.clone(), header.clone(), header, prop::collection::vec(any::<u8>(), 0..64)), |(id, ts, sig, body)| {
        prop_assert!(verify(&id, &ts, &sig, &body).is_err());
        let bearer = WebhookAuth {
            signing_secrets: vec![],
            bearer_tokens: vec![onramp::domain::secret::Secret::new("t0k3n")],
            tolerance: Duration::from_secs(300),
        };
        let h = AuthHeaders { authorization: Some(&sig), ..AuthHeaders::default() };
        prop_assert!(bearer.verify(&h, &body, NOW).is_err() || sig.trim_start_matches("Bearer ").trim() == "t0k3n");
        let _ = id.parse::<SigningSecret>();
        Ok(())
    });
}

// ---- the delivery parser ----

fn has_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(a) => a.iter().any(has_nul),
        Value::Object(m) => m.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// What the webhook does with a verified body, and what must hold of it.
fn deliver(raw: &[u8]) -> Result<(), TestCaseError> {
    let Ok(mut body) = serde_json::from_slice::<Value>(raw) else { return Ok(()) };
    if !body.is_object() {
        return Ok(());
    }
    event::scrub_nul(&mut body);
    prop_assert!(!has_nul(&body), "NUL left after scrubbing");
    prop_assert!(!event::scrub_nul(&mut body), "scrubbing twice changed something");
    let p = event::parse(&body, MAX_USERS);
    prop_assert_eq!(&p, &event::parse(&body, MAX_USERS));
    prop_assert!(["structured", "default", "unknown"].contains(&p.shape));
    prop_assert!(p.subjects.len() <= MAX_USERS, "{} subjects", p.subjects.len());
    if p.subjects.len() > 1 {
        let users = p.subjects.iter().filter(|s| matches!(s, Subject::User { .. })).count();
        prop_assert_eq!(users, p.subjects.len(), "only a group's users come in numbers");
    }
    prop_assert!(p.event_uuid.as_ref().is_none_or(|u| !u.is_empty() && u.len() <= 64));
    let key = event::delivery_key(&p, Some("msg_1"), raw, NOW);
    prop_assert!(!key.contains('\0') && key.len() <= 6 + 64);
    let key = event::delivery_key(&p, None, raw, NOW);
    prop_assert!(!key.contains('\0') && key.len() <= 6 + 64 + 21);
    Ok(())
}

/// JSON in the shapes the parser looks for: its keys and values, nested, with NUL here and there.
fn json_value() -> impl Strategy<Value = Value> {
    let words = prop::sample::select(vec![
        "action",
        "model",
        "diff",
        "users",
        "add",
        "remove",
        "pk",
        "name",
        "app",
        "model_name",
        "body",
        "severity",
        "event_uuid",
        "context",
        "actor",
        "authentik_core",
        "user",
        "group",
        "model_updated",
        "model_created",
        "model_deleted",
        "user_write",
        "tenant-foo-users",
        "42",
        "-1",
        "",
        "\0",
        "a\0b",
        "model_updated: {}",
    ]);
    let string = prop_oneof![words.clone().prop_map(String::from), "[a-z_0-9 :\\x00\u{FFFD}\u{202E}]{0,12}"];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-3i64..300).prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        string.clone().prop_map(Value::from),
    ];
    leaf.prop_recursive(6, 256, 24, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..24).prop_map(Value::from),
            prop::collection::btree_map(string.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

#[test]
fn fuzz_delivery_parser() {
    for (name, raw) in seeds("delivery") {
        deliver(&raw).unwrap_or_else(|e| panic!("seed {name}: {e}"));
    }
    fuzz(prop::collection::vec(any::<u8>(), 0..512), |raw| deliver(&raw));
    fuzz(mutated("delivery", b"{}[]\":,0123456789-.eE\\u tfnl\0\xff"), |raw| deliver(&raw));
    // objects only, so that the parser sees every one of them
    fuzz(
        prop::collection::btree_map("[a-z_]{0,10}|action|model|diff|context|actor|body|severity", json_value(), 0..8),
        |m| deliver(&serde_json::to_vec(&m).unwrap()),
    );
}

// ---- the tenant registry ----

fn registry(text: &str) -> Result<(), TestCaseError> {
    match TenantRegistry::parse(text, "fuzz.yaml") {
        Ok(reg) => {
            for t in &reg.tenants {
                prop_assert!(reg.tenant(t.name.as_str()).is_some());
                prop_assert!(reg.tenants_of_group(&t.group).iter().any(|x| x.name == t.name));
            }
        }
        Err(e) => {
            prop_assert!(!e.mistakes.is_empty());
            prop_assert!(e.to_string().starts_with("tenant registry fuzz.yaml: "));
        }
    }
    Ok(())
}

#[test]
fn fuzz_registry_parser() {
    for (name, text) in seeds("registry") {
        registry(&String::from_utf8_lossy(&text)).unwrap_or_else(|e| panic!("seed {name}: {e}"));
    }
    fuzz("(?s).{0,400}", |text| registry(&text));
    fuzz(mutated("registry", b" \n\t-:{}[],#&*!|>'\"%@`?~0123456789azAZ_/=."), |text| {
        registry(&String::from_utf8_lossy(&text))
    });
}

// ---- Slurm's output ----

/// Every reader on `text`, as stdout and as stderr, with rc 0 and 1.
fn slurm_readers(text: &str) {
    for code in [0, 1, -1] {
        for out in [
            Output { code, stdout: text.into(), stderr: String::new() },
            Output { code, stdout: String::new(), stderr: text.into() },
        ] {
            let _ = parse::outcome("c", &out);
            let _ = parse::read_ok("c", &out);
        }
    }
    let _ = parse::assocs("c", text);
    let _ = parse::accounts("c", text);
    let _ = parse::user_assocs("c", text);
    let _ = parse::jobs("c", text);
    let _ = parse::config(text);
    let _ = parse::cgroup_conf(text);
    let _ = Tres::parse(text);
}

fn limit() -> impl Strategy<Value = Limit> {
    prop_oneof![Just(Limit::Unlimited), any::<u64>().prop_map(Limit::At)]
}

fn tres() -> impl Strategy<Value = Tres> {
    let name = prop_oneof![Just("cpu".to_string()), Just("mem".to_string()), "gres/[a-z0-9_:-]{1,8}"];
    prop::collection::vec((name, any::<u64>()), 0..4)
        .prop_map(|items| items.into_iter().fold(Tres::new(), |t, (n, c)| t.with(&n, c).expect("a TRES name")))
}

fn field() -> impl Strategy<Value = String> {
    "[a-z0-9_-]{0,12}"
}

#[test]
fn fuzz_sacctmgr_parser() {
    for (name, text) in seeds("sacctmgr") {
        let text = String::from_utf8(text).unwrap_or_else(|_| panic!("seed {name} is not UTF-8"));
        slurm_readers(&text);
    }
    fuzz("(?s).{0,400}", |text| {
        slurm_readers(&text);
        Ok(())
    });
    fuzz(mutated("sacctmgr", b"|\n=,'/0123456789GMTPX -parentJobID"), |text| {
        slurm_readers(&String::from_utf8_lossy(&text));
        Ok(())
    });
    // well-formed rows read back as written
    let share = prop_oneof![Just(Fairshare::Parent), any::<u32>().prop_map(Fairshare::Shares)];
    let row = (
        (field(), field(), field(), field(), field(), share),
        (limit(), limit(), tres(), tres(), limit(), limit()),
        (prop::collection::btree_set("[a-z]{1,6}", 0..3), field()),
    );
    fuzz(prop::collection::vec(row, 1..4), |rows| {
        let text: String = rows
            .iter()
            .map(|((c, a, u, p, parent, share), (gj, gs, gt, gtm, mj, ms), (qos, dq))| {
                let l = |l: &Limit| if let Limit::At(n) = l { n.to_string() } else { String::new() };
                let qos: Vec<&str> = qos.iter().map(String::as_str).collect();
                format!(
                    "{c}|{a}|{u}|{p}|{parent}|{}|{}|{}|{gt}|{gtm}|{}|{}|{}|{dq}\n",
                    share.arg(),
                    l(gj),
                    l(gs),
                    l(mj),
                    l(ms),
                    qos.join(",")
                )
            })
            .collect();
        let read = parse::assocs("c", &text).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
        prop_assert_eq!(read.len(), rows.len());
        for (got, ((c, a, u, p, parent, share), (gj, gs, gt, gtm, mj, ms), (qos, dq))) in read.iter().zip(&rows) {
            prop_assert_eq!((&got.cluster, &got.account, &got.user, &got.partition, &got.parent), (c, a, u, p, parent));
            prop_assert_eq!((got.fairshare, got.grp_jobs, got.grp_submit_jobs), (*share, *gj, *gs));
            prop_assert_eq!(
                (&got.grp_tres, &got.grp_tres_mins, got.max_jobs, got.max_submit_jobs),
                (gt, gtm, *mj, *ms)
            );
            prop_assert_eq!(&got.qos, &qos.iter().cloned().collect::<Vec<_>>());
            prop_assert_eq!(&got.default_qos, dq);
        }
        Ok(())
    });
}
