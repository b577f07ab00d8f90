//! Reserved identities (issue 13, defect 3): system names, uids/gids outside the site's range and
//! uids shared by two users are never made cluster users; members with such identities are not
//! offboarded either; the drift report says why.

use std::collections::BTreeMap;
use std::time::Duration;

use onramp::backends::authentik::User;
use onramp::domain::names::{SlurmAccount, Username};
use onramp::domain::tenants::TenantRegistry;
use onramp::engine::{Actor, NewJob};
use onramp::flows::reconcile::plan::{plan_tenant, plan_user};
use onramp::flows::user_onboard::USER_ONBOARD;
use serde_json::{Value, json};

use crate::common::eventually;
use crate::flows_support::{CAROL, Harness, PK, UNIX_USER, short};
use crate::intake_support::FakeUser;

const REGISTRY: &str = "uid_offset: 5000\ngid_offset: 5000\nidentities: { reserved_names: [svc-*], uid_max: 60000 }\n\
tenants:\n  - name: foo\n    group: foo-users\n";

fn user(pk: i64, name: &str, attributes: Value) -> User {
    serde_json::from_value(json!({"pk": pk, "username": name, "is_active": true, "attributes": attributes,
        "groups_obj": [{"pk": "uuid-foo", "name": "foo-users"}]}))
    .unwrap()
}

fn assoc(u: &str) -> (SlurmAccount, Username) {
    (SlurmAccount::parse("tenant-foo").unwrap(), Username::parse(u).unwrap())
}

#[test]
fn reconcile_neither_onboards_nor_offboards_reserved_or_bad_identities() {
    let reg = TenantRegistry::parse(REGISTRY, "test").unwrap();
    let members = BTreeMap::from([(
        "foo-users".to_string(),
        vec![
            user(1, "alice", json!({})),
            user(2, "root", json!({})),
            user(3, "svc-backup", json!({})),
            user(4, "mallory", json!({"uidNumber": 0})),
            user(5, "eve", json!({"uidNumber": 5001})), // alice's uid (pk 1 + 5000)
            user(6, "olga", json!({"gidNumber": 999})),
            user(7, "bob", json!({})),
        ],
    )]);
    // mallory and olga were onboarded before their numbers went wrong; slurm sits in the account
    let actual = [assoc("mallory"), assoc("olga"), assoc("slurm")];
    let plan = plan_tenant(&reg, reg.tenant("foo").unwrap(), &members, &actual, &Default::default(), None);
    let onboard: Vec<&str> = plan.onboard.iter().map(|a| a.username.as_str()).collect();
    assert_eq!(onboard, ["bob"], "{plan:#?}");
    assert!(plan.offboard.is_empty(), "members with bad identities and reserved names are left alone: {plan:#?}");
    let skipped = plan.skipped.join("\n");
    for why in [
        "root is a reserved system name",
        "svc-backup is a reserved system name",
        "mallory's uid 0 is outside the site's range 1000..=60000",
        "olga's gid 999 is outside",
        "uid 5001 is shared by alice, eve",
        "slurm has an association under tenant-foo but is a reserved name",
    ] {
        assert!(skipped.contains(why), "drift report lacks {why:?}:\n{skipped}");
    }

    // the per-user path: root gone from Authentik still is not offboarded
    let (actions, why) =
        plan_user(&reg, None, &Username::parse("root").unwrap(), &[assoc("root")], &Default::default());
    assert!(actions.is_empty() && why.contains("reserved"), "{why}");
    // a member whose uid is now 0 keeps their association (nothing is done, and it says why)
    let m = user(4, "mallory", json!({"uidNumber": 0}));
    let (actions, why) =
        plan_user(&reg, Some(&m), &Username::parse("mallory").unwrap(), &[assoc("mallory")], &Default::default());
    assert!(actions.is_empty() && why.contains("uid 0"), "{why}");
}

#[test]
fn the_registry_refuses_a_floor_of_zero() {
    let e =
        TenantRegistry::parse("identities: { uid_min: 0 }\ntenants:\n  - name: foo\n    group: g\n", "t").unwrap_err();
    assert!(e.to_string().contains("identities.uid_min"), "{e}");
}

fn onboard(h: &Harness, username: &str, pk: i64) -> NewJob {
    NewJob::new(
        USER_ONBOARD,
        &format!("{}/{username}", h.tenant),
        json!({ "tenant": h.tenant, "account": h.team, "username": username, "pk": pk }),
        Actor::cli("test"),
    )
}

/// The onboarding job fails at `resolve_user`, before any key, home or association is written.
async fn fails_at_resolve(h: &Harness, job: NewJob, want: &str) {
    let id = h.engine.enqueue(&[job]).await.unwrap()[0].id;
    let stopped = tokio::time::timeout(
        Duration::from_secs(60),
        eventually(Duration::from_secs(70), "the onboarding to stop", || async {
            let j = h.engine.job(id).await.unwrap();
            (j.state.as_str() != "pending" && j.state.as_str() != "running").then_some(j)
        }),
    )
    .await;
    let j = match stopped {
        Ok(j) => j,
        Err(_) => panic!("job {id} did not stop: {:?}", h.engine.job(id).await.unwrap()),
    };
    assert_eq!((j.state.as_str(), j.step.as_str()), ("failed", "resolve_user"), "{:?}", j.last_error);
    let err = j.last_error.unwrap_or_default();
    assert!(err.contains(want), "{err}");
    // a failed job holds its subject until a person retries or cancels it
    h.engine.cancel(id, &Actor::cli("test"), Some("next case")).await.unwrap();
}

#[tokio::test]
async fn onboarding_stops_at_reserved_names_bad_numbers_and_taken_uids() {
    let _one = CAROL.lock().await;
    let h = Harness::start(short()).await;
    h.ensure_tenant_accounts().await;
    h.add_carol(true);
    h.sync_key();
    let key = h.ak.lock().unwrap().users[&PK].attributes.clone();

    // root, in the tenant's group with a key: refused by name
    let mut root = FakeUser::new(90, "root", &[&h.group]);
    root.attributes = key.clone();
    h.ak.lock().unwrap().users.insert(90, root);
    fails_at_resolve(&h, onboard(&h, "root", 90), "root is a reserved system name").await;

    // carol with uidNumber 0
    h.ak.lock().unwrap().users.get_mut(&PK).unwrap().attributes["uidNumber"] = json!(0);
    fails_at_resolve(&h, onboard(&h, UNIX_USER, PK), "uid 0 is outside the site's range").await;

    // carol's own uid 5003, claimed earlier by someone else: never shared
    h.ak.lock().unwrap().users.get_mut(&PK).unwrap().attributes = key;
    sqlx::query("insert into claims (scope, value, owner) values ('uid', '5003', 'onramp-former')")
        .execute(h.engine.pool())
        .await
        .unwrap();
    fails_at_resolve(&h, onboard(&h, UNIX_USER, PK), "uid 5003 is already onramp-former's").await;

    // nothing was written for any of them
    assert!(!h.root.path().join("home/root").exists() && !h.root.path().join("home").join(UNIX_USER).exists());
    assert!(h.assocs().await.iter().all(|r| r[1] != "root" && r[1] != UNIX_USER), "{:?}", h.assocs().await);

    // once the claim is hers, she is onboarded (and claiming again is idempotent)
    sqlx::query("update claims set owner = $1 where scope = 'uid' and value = '5003'")
        .bind(UNIX_USER)
        .execute(h.engine.pool())
        .await
        .unwrap();
    h.run_to_success(onboard(&h, UNIX_USER, PK)).await;
}
