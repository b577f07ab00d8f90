#!/usr/bin/env python3
"""Writes tests/corpus/hostile.jsonl: the hostile-request corpus run by tests/it/corpus.rs.

Each line is one request with the statuses it may get. Edit this file and rerun it
(`python3 tests/corpus/generate.py`); both files are kept in the repository.

Fields of a case:
  family, name   what it is
  method, target the request line's method and target (bytes as written; may hold %-escapes)
  auth           none | admin | operator_foo | viewer_foo | operator | raw:<Authorization value>
  headers        extra headers (name -> value)
  body           text body; body_hex: bytes in hex; gen: a generated body (see corpus.rs)
  sign           webhook signing: good | none | bad | other_secret | old | future | no_id |
                 bad_timestamp | replay_other_body
  framing        length (default) | chunked | truncated (Content-Length more than sent, then EOF) |
                 chunked_truncated | no_length
  expect         allowed statuses; 0 means "the server closed the connection without answering"
Placeholders in target and body: {job_foo} {job_bar} {job_reconcile} (ids of existing jobs).
"""

import json
import os

cases = []


def case(family, name, method, target, expect, **kw):
    c = {"family": family, "name": name, "method": method, "target": target, "expect": expect}
    c.update(kw)
    cases.append(c)


HOOK = "/webhooks/authentik"


def event(model, action="model_updated", **extra):
    body = {"event_uuid": None, "action": action, "app": "authentik.events.models",
            "model": model, "context": {"model": model}, "created": "2026-11-30T00:00:00Z"}
    body.update(extra)
    return body


def user_model(pk, name="alice"):
    return {"app": "authentik_core", "model_name": "user", "pk": pk, "name": name}


def group_model(name):
    return {"app": "authentik_core", "model_name": "group", "pk": "0d5c7c0e-3b0e-4c1a-9a53-1c3a0f6f0b11", "name": name}


def hook(family, name, body, expect, **kw):
    """A webhook delivery; `body` is a dict (event_uuid filled in per run) or raw text."""
    kw.setdefault("sign", "good")
    kw.setdefault("headers", {"content-type": "application/json"})
    if isinstance(body, dict):
        case(family, name, "POST", HOOK, expect, body=json.dumps(body), fresh_uuid=True, **kw)
    else:
        case(family, name, "POST", HOOK, expect, body=body, **kw)


# --- webhook: authentication -------------------------------------------------------------
good = event(user_model(1))
hook("webhook-auth", "unsigned", good, [401], sign="none")
hook("webhook-auth", "bad signature", good, [401], sign="bad")
hook("webhook-auth", "signed with another secret", good, [401], sign="other_secret")
hook("webhook-auth", "timestamp an hour old (replayed)", good, [401], sign="old")
hook("webhook-auth", "timestamp an hour ahead (future-dated)", good, [401], sign="future")
hook("webhook-auth", "no webhook-id", good, [401], sign="no_id")
hook("webhook-auth", "timestamp not a number", good, [401], sign="bad_timestamp")
hook("webhook-auth", "a captured signature over another body", good, [401], sign="replay_other_body")
for scheme in ["Basic YWRtaW46YWRtaW4=", "Bearer ", "Bearer wrong", "Bearer " + "x" * 10000, "bearer whsec_x"]:
    hook("webhook-auth", f"Authorization {scheme[:20]!r} instead of a signature", good, [401], sign="none",
         headers={"content-type": "application/json", "authorization": scheme})
for sig in ["v1,", "v1,!!!!", "v2,abc", "v1," + "A" * 10000, "v1a,abcd", " , , ", "v1,a v1,b v1,c"]:
    hook("webhook-auth", f"signature header {sig[:16]!r}", good, [401], sign="none",
         headers={"content-type": "application/json", "webhook-id": "msg_x", "webhook-timestamp": "1700000000",
                  "webhook-signature": sig})

# --- webhook: framing, size, encoding ------------------------------------------------------
hook("webhook-body", "over the limit with Content-Length", "x", [413], generate="big_json:1100000")
hook("webhook-body", "over the limit, chunked", "x", [413], generate="big_json:1100000", framing="chunked")
hook("webhook-body", "Content-Length says 2 GB", "{}", [413],
     headers={"content-type": "application/json", "content-length-override": "2000000000"}, framing="truncated")
hook("webhook-body", "truncated: Content-Length 100, 2 bytes sent", "{}", [400, 0],
     headers={"content-type": "application/json", "content-length-override": "100"}, framing="truncated")
hook("webhook-body", "chunked and cut mid-chunk", json.dumps(good), [400, 0], framing="chunked_truncated")
hook("webhook-body", "not JSON", "this is not json", [400])
hook("webhook-body", "empty body", "", [400])
hook("webhook-body", "a JSON array", "[1,2,3]", [400])
hook("webhook-body", "a JSON string", '"hello"', [400])
hook("webhook-body", "JSON null", "null", [400])
hook("webhook-body", "trailing garbage", json.dumps(good) + "garbage", [400])
hook("webhook-body", "two objects", json.dumps(good) + json.dumps(good), [400])
hook("webhook-body", "invalid UTF-8", "x", [400], body_hex=(b'{"action":"model_updated","x":"\xff\xfe"}').hex())
hook("webhook-body", "UTF-16 with BOM", "x", [400], body_hex=("\ufeff" + json.dumps(good)).encode("utf-16").hex())
hook("webhook-body", "lone surrogate escape", '{"action":"model_updated","x":"\\ud800"}', [202, 400])
hook("webhook-body", "deeply nested arrays (10000)", "x", [400], generate="deep:10000")
hook("webhook-body", "deeply nested objects (5000)", "x", [400], generate="deep_obj:5000")
hook("webhook-body", "nested just under the parser's limit (100)", "x", [202], generate="deep:100")
hook("webhook-body", "wide object (50000 keys)", "x", [202], generate="wide:50000")
hook("webhook-body", "one 900 kB string", "x", [202], generate="long_value:900000")
hook("webhook-body", "numbers out of range", '{"action":"model_updated","model":{"model_name":"user","app":"authentik_core","pk":1e400}}', [202, 400])
for ctype in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "", "application/jsonp",
              "application/json-seq", "json"]:
    hook("webhook-body", f"content-type {ctype!r}", good, [415],
         headers={"content-type": ctype} if ctype else {})
hook("webhook-body", "content-type with charset", good, [202],
     headers={"content-type": "application/json; charset=utf-8"})
hook("webhook-body", "content-type in capitals", good, [202], headers={"content-type": "APPLICATION/JSON"})

# --- webhook: NUL and control characters (defect 4): stored with NUL escaped, or refused 4xx -----
for where, model in [("action", None), ("user name", user_model(1, "al\u0000ice")), ("group name", group_model("tenant-foo\u0000-users")),
                     ("context", None), ("key", None)]:
    if where == "action":
        body = event(user_model(1), action="model_\u0000updated")
    elif where == "context":
        body = event(user_model(1)); body["context"]["note"] = "\u0000" * 100
    elif where == "key":
        body = event(user_model(1)); body["k\u0000ey"] = 1
    else:
        body = event(model)
    hook("webhook-nul", f"NUL in the {where}", body, [202, 400, 422])
for ch in ["\u0001", "\u001b[31m", "\u007f", "\r\n", "\u2028", "\ufffe"]:
    hook("webhook-nul", f"control character {ch!r} in a user name", event(user_model(1, f"al{ch}ice")), [202])

# --- webhook: hostile names and numbers inside a signed event: stored, only reconciles queued -----
HOSTILE_NAMES = [
    "; rm -rf /", "$(reboot)", "`id`", "a|b", "a&&b", "a>b", "-rf", "--help", "-oProxyCommand=x", "a,b", "a=b",
    "name=root", "../../etc/passwd", "..", "/", "a/b", "a b", "\t", "'", '"', "\\", "*", "?", "{a}", "${IFS}",
    "%00", "%2e%2e%2f", "ROOT", "root", "akadmin", "slurm", "x" * 10000, "é", "ａ", "🙂", "",
]
for i, n in enumerate(HOSTILE_NAMES):
    hook("webhook-names", f"user name {n[:24]!r}", event(user_model(100 + i, n)), [202])
for i, n in enumerate(HOSTILE_NAMES[:20]):
    hook("webhook-names", f"group name {n[:24]!r}", event(group_model(n)), [202])
for pk in [-1, 0, 2**63, "1", "1; drop table jobs", None, [], {}, 1.5, True]:
    hook("webhook-names", f"user pk {json.dumps(pk)[:20]}", event({"app": "authentik_core", "model_name": "user", "pk": pk}), [202])
hook("webhook-names", "a group diff of 50000 users", "x", [202], generate="group_diff:50000")

# --- /v1: authentication ------------------------------------------------------------------
for name, value in [("no token", None), ("unknown token", "Bearer onr_nope"), ("empty bearer", "Bearer "),
                    ("basic auth", "Basic YWRtaW46YWRtaW4="), ("token 10k chars", "Bearer " + "a" * 10000),
                    ("bearer lowercase unknown", "bearer onr_nope"), ("two tokens", "Bearer a, Bearer b"),
                    ("control bytes", "Bearer onr_\u0001\u0002"), ("token with quotes", 'Bearer "onr_x"')]:
    auth = "none" if value is None else "raw:" + value
    for target in ["/v1/jobs", "/v1/whoami", "/v1/tenants", "/v1/tokens"]:
        # guesses beyond the limiter's budget from one source are 429 (a valid token never is)
        # (a header value with control bytes is not HTTP: 400 before any token check)
        want = [401] if value is None else [400, 401, 429] if "\u0001" in value else [401, 429]
        case("v1-auth", f"{name} on GET {target}", "GET", target, want, auth=auth)

# --- /v1: query parameters (defect 6: NUL is 400) ----------------------------------------------
BAD_VALUES = [("NUL", "%00"), ("NUL inside", "fo%00o"), ("control char", "%01"), ("escape sequence", "%1b%5b31m"),
              ("invalid UTF-8", "%ff%fe"), ("overlong UTF-8", "%c0%af"), ("10k chars", "a" * 10000)]
def bad_value(vname, ok=(200,)):
    """NUL is always 400 (defect 6); other odd values may also just match nothing."""
    return [400] if "NUL" in vname else sorted({400, 422, *ok})


for param in ["tenant", "subject", "kind", "user", "state"]:
    for vname, v in BAD_VALUES:
        extra = "&tenant=foo" if param == "user" else ""
        case("v1-query", f"jobs {param}= {vname}", "GET", f"/v1/jobs?{param}={v}{extra}",
             bad_value(vname, ok=() if param == "state" else (200,)), auth="admin")
for param in ["tenant", "subject", "kind", "user"]:
    for vname, v in [("shell metacharacters", "%3Brm%20-rf%20%2F"), ("leading dash", "-rf"), ("comma", "a%2Cb"),
                     ("equals", "a%3Db"), ("path traversal", "..%2F..%2Fetc"), ("percent-encoded slash", "a%2Fb")]:
        extra = "&tenant=foo" if param == "user" else ""
        case("v1-query", f"jobs {param}= {vname}", "GET", f"/v1/jobs?{param}={v}{extra}", [200, 400, 422], auth="admin")
for vname, v in [("zero", "0"), ("negative", "-1"), ("above the maximum", "501"), ("huge", "99999999999999999999"),
                 ("text", "abc"), ("float", "1.5"), ("exponent", "1e3"), ("empty", ""), ("NUL", "%00")]:
    case("v1-query", f"limit {vname}", "GET", f"/v1/jobs?limit={v}", [400], auth="admin")
for vname, v in [("text", "abc"), ("negative", "-5"), ("huge", "99999999999999999999"), ("NUL", "%00"), ("float", "2.5")]:
    # a negative cursor is a valid number that is before every job: an empty page
    case("v1-query", f"before (cursor) {vname}", "GET", f"/v1/jobs?before={v}", [200, 400] if vname == "negative" else [400],
         auth="admin")
for vname, v in [("not a date", "yesterday"), ("NUL", "%00"), ("year 99999", "99999-01-01T00:00:00Z")]:
    case("v1-query", f"created_since {vname}", "GET", f"/v1/jobs?created_since={v}", [400], auth="admin")
case("v1-query", "state=bogus", "GET", "/v1/jobs?state=bogus", [400], auth="admin")
case("v1-query", "unknown parameter", "GET", "/v1/jobs?evil=1", [200, 400], auth="admin")
case("v1-query", "user without tenant", "GET", "/v1/jobs?user=alice", [400, 422], auth="admin")
case("v1-query", "10000 parameters", "GET", "/v1/jobs?" + "&".join(f"p{i}=1" for i in range(2000)), [200, 400, 414, 431], auth="admin")
for vname, v in BAD_VALUES:
    case("v1-query", f"drift tenant= {vname}", "GET", f"/v1/drift?tenant={v}", bad_value(vname, ok=(404,)), auth="admin")
    case("v1-query", f"plans tenant= {vname}", "GET", f"/v1/plans/user.onboard?tenant={v}&user=alice", [400, 422], auth="admin")
    case("v1-query", f"plans user= {vname}", "GET", f"/v1/plans/user.onboard?tenant=foo&user={v}", [400, 422], auth="admin")
    case("v1-query", f"stream tenant= {vname}", "GET", f"/v1/stream?tenant={v}", bad_value(vname), auth="admin")

# --- /v1: paths ------------------------------------------------------------------------
for vname, v in [("text", "abc"), ("negative", "-1"), ("zero", "0"), ("huge", "99999999999999999999"), ("NUL", "%00"),
                 ("traversal", "..%2F..%2Fetc%2Fpasswd"), ("shell", "1%3Bls"), ("float", "1.0"), ("10k chars", "9" * 10000),
                 ("unknown", "987654321")]:
    want = [404] if vname in ("zero", "unknown", "negative") else [400, 404]
    case("v1-path", f"GET job {vname}", "GET", f"/v1/jobs/{v}", want, auth="admin")
    for action in ["cancel", "retry", "approve"]:
        case("v1-path", f"POST job {vname} {action}", "POST", f"/v1/jobs/{v}/{action}", want, auth="admin")
for vname, v in [("NUL", "fo%00o"), ("traversal", "..%2F..%2Fetc"), ("shell", "foo%3Bls"), ("leading dash", "-foo"),
                 ("capitals", "FOO"), ("10k chars", "f" * 10000), ("invalid UTF-8", "%ff"), ("unknown", "nosuch")]:
    case("v1-path", f"GET tenant {vname}", "GET", f"/v1/tenants/{v}", [400, 404], auth="admin")
    case("v1-path", f"plan flow {vname}", "GET", f"/v1/plans/{v}?tenant=foo", [400, 404, 422], auth="admin")
    case("v1-path", f"revoke token {vname}", "POST", f"/v1/tokens/{v}/revoke", [400, 404], auth="admin")
case("v1-path", "raw NUL byte in the path", "GET", "/v1/jobs/\u0000", [400, 0], auth="admin")
case("v1-path", "a space in the request line", "GET", "/v1/jobs /x", [400, 0], auth="admin")
case("v1-path", "absolute-form target", "GET", "http://evil.example/v1/jobs", [200, 400, 404], auth="admin")
case("v1-path", "DELETE a job", "DELETE", "/v1/jobs/{job_foo}", [405], auth="admin")
case("v1-path", "TRACE", "TRACE", "/v1/jobs", [405], auth="admin")

# --- /v1: starting work (bodies) -------------------------------------------------------------
J = {"content-type": "application/json"}


def start(name, body, expect, auth="admin", family="v1-start", **kw):
    kw.setdefault("headers", J)
    case(family, name, "POST", "/v1/jobs", expect, auth=auth,
         body=body if isinstance(body, str) else json.dumps(body), **kw)


for n in HOSTILE_NAMES:
    start(f"onboard username {n[:24]!r}", {"kind": "user.onboard", "tenant": "foo", "username": n}, [400, 422])
for n in ["; rm -rf /", "-rf", "a,b", "a=b", "../x", "x" * 10000, "fo\u0000o", "FOO", "nosuch", "reconcile", ""]:
    start(f"tenant {n[:24]!r}", {"kind": "tenant.onboard", "tenant": n}, [400, 422])
    start(f"account {n[:24]!r}", {"kind": "user.onboard", "tenant": "foo", "account": n, "username": "alice"}, [400, 422])
for n in ["root", "akadmin", "slurm", "munge", "sshd", "nobody", "postgres", "daemon"]:
    start(f"offboard system account {n}", {"kind": "user.offboard", "tenant": "foo", "username": n}, [422])
    start(f"offboard system account {n} as the tenant's operator", {"kind": "user.offboard", "tenant": "foo", "username": n},
          [422], auth="operator_foo")
start("offboard a user who never was in the tenant", {"kind": "user.offboard", "tenant": "foo", "username": "stranger"}, [422])
start("offboard another tenant's user as foo's operator", {"kind": "user.offboard", "tenant": "bar", "username": "bob"}, [403],
      auth="operator_foo")
start("hard cutoff by an operator", {"kind": "user.offboard", "tenant": "foo", "username": "alice", "hard_cutoff": True},
      [403], auth="operator")
start("tenant offboarding by an operator", {"kind": "tenant.offboard", "tenant": "foo"}, [403], auth="operator")
start("viewer starts work", {"kind": "user.onboard", "tenant": "foo", "username": "alice"}, [403], auth="viewer_foo")
start("scoped token runs a full reconcile", {"kind": "reconcile.full"}, [403], auth="operator_foo")
for name, body in [("unknown kind", {"kind": "bogus"}), ("kind NUL", {"kind": "user.\u0000onboard"}),
                   ("kind 10k", {"kind": "k" * 10000}), ("no kind", {"tenant": "foo"}), ("kind a number", {"kind": 1}),
                   ("username a number", {"kind": "user.onboard", "tenant": "foo", "username": 7}),
                   ("username null", {"kind": "user.onboard", "tenant": "foo", "username": None}),
                   ("username an array", {"kind": "user.onboard", "tenant": "foo", "username": ["root"]}),
                   ("hard_cutoff a string", {"kind": "user.offboard", "tenant": "foo", "username": "alice", "hard_cutoff": "yes"}),
                   ("extra field", {"kind": "reconcile.full", "shell": "rm -rf /"})]:
    start(name, body, [400, 422])
start("not JSON", "kind=user.onboard", [400, 415, 422])
start("invalid UTF-8", "x", [400, 422], body_hex=b'{"kind":"user.onboard","tenant":"foo","username":"\xff"}'.hex())
start("deep JSON", "x", [400, 422], generate="deep:10000")
start("wide JSON", "x", [400, 413, 422], generate="wide:50000")
start("over the body limit", "x", [413], generate="big_json:2000000")
start("over the body limit, chunked", "x", [413], generate="big_json:2000000", framing="chunked")
start("truncated body", '{"kind":', [400, 0], headers={**J, "content-length-override": "100"}, framing="truncated")
start("wrong content-type", {"kind": "reconcile.full"}, [415], headers={"content-type": "text/plain"})
start("no content-type", {"kind": "reconcile.full"}, [415], headers={})
for key in ["\u0000", "k" * 201, "a b", "é", ""]:
    start(f"Idempotency-Key {key[:12]!r}", {"kind": "user.onboard", "tenant": "foo", "username": "-x"}, [400, 422],
          headers={**J, "idempotency-key": key})

# --- /v1: tokens ------------------------------------------------------------------------
def token(name, body, expect, auth="admin"):
    case("v1-tokens", name, "POST", "/v1/tokens", expect, auth=auth, headers=J,
         body=body if isinstance(body, str) else json.dumps(body))


for n in ["reconcile", "nosuch", "FOO", "fo\u0000o", "../foo", "-foo", "x" * 10000, ""]:
    token(f"token for tenant {n[:16]!r}", {"name": f"t-{len(cases)}", "role": "viewer", "tenant": n}, [400, 422])
for n in ["a\u0000b", "a b", "x" * 65, "settings:ONRAMP_API_TOKEN", "", "../x", "a;b", "é"]:
    token(f"token name {n[:16]!r}", {"name": n, "role": "viewer"}, [400, 422])
for r in ["root", "ADMIN", "", "admin\u0000", 1, None]:
    token(f"role {json.dumps(r)[:16]}", {"name": f"r-{len(cases)}", "role": r}, [400, 422])
for e in ["forever", "-1d", "0s", "9999999d", "1y", "\u0000"]:
    token(f"expires_in {e!r}", {"name": f"e-{len(cases)}", "role": "viewer", "expires_in": e}, [400, 422])
token("an operator mints a token", {"name": "op-mint", "role": "admin"}, [403], auth="operator")
token("a scoped admin mints an unscoped token", {"name": "esc", "role": "viewer"}, [403, 422], auth="admin_foo")

# --- /v1: reading across tenants ------------------------------------------------------------
case("v1-scope", "foo's viewer reads bar's job", "GET", "/v1/jobs/{job_bar}", [403, 404], auth="viewer_foo")
case("v1-scope", "foo's viewer reads a reconcile job", "GET", "/v1/jobs/{job_reconcile}", [403, 404], auth="viewer_foo")
case("v1-scope", "foo's viewer lists tenant=reconcile", "GET", "/v1/jobs?tenant=reconcile", [200, 403], auth="viewer_foo",
     no_subjects_outside="foo/")
case("v1-scope", "foo's viewer lists subject=reconcile/", "GET", "/v1/jobs?subject=reconcile%2F", [200, 403], auth="viewer_foo",
     no_subjects_outside="foo/")
case("v1-scope", "foo's viewer plans bar's user", "GET", "/v1/plans/user.onboard?tenant=bar&user=bob", [403, 404], auth="viewer_foo")
case("v1-scope", "foo's viewer plans a stranger", "GET", "/v1/plans/user.onboard?tenant=foo&user=stranger", [404],
     auth="viewer_foo", no_text="stranger@")
case("v1-scope", "foo's viewer plans akadmin", "GET", "/v1/plans/user.offboard?tenant=foo&user=akadmin", [404, 422],
     auth="viewer_foo", no_text="akadmin@")
case("v1-scope", "foo's operator cancels bar's job", "POST", "/v1/jobs/{job_bar}/cancel", [403, 404], auth="operator_foo")
case("v1-scope", "foo's operator approves a reconcile job", "POST", "/v1/jobs/{job_reconcile}/approve", [403, 404],
     auth="operator_foo")
case("v1-scope", "foo's viewer reads bar's tenant", "GET", "/v1/tenants/bar", [403, 404], auth="viewer_foo")

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile.jsonl")
with open(out, "w") as f:
    for c in cases:
        f.write(json.dumps(c, ensure_ascii=True) + "\n")
families = {}
for c in cases:
    families[c["family"]] = families.get(c["family"], 0) + 1
print(f"{len(cases)} cases: " + ", ".join(f"{k} {v}" for k, v in families.items()))
