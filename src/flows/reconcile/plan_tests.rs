//! plan.rs's unit tests.

use super::*;
use serde_json::json;

fn reg() -> TenantRegistry {
    TenantRegistry::parse(
        "tenants:\n  - name: foo\n    group: foo-users\n    teams:\n      - { account: ml-foo, group: foo-ml }\n",
        "t",
    )
    .unwrap()
}

fn user(pk: i64, name: &str, groups: &[&str]) -> User {
    serde_json::from_value(json!({"pk": pk, "username": name, "is_active": true,
        "groups_obj": groups.iter().map(|g| json!({"pk": format!("uuid-{g}"), "name": g})).collect::<Vec<_>>()}))
    .unwrap()
}

fn acc(a: &str, u: &str) -> (SlurmAccount, Username) {
    (SlurmAccount::parse(a).unwrap(), Username::parse(u).unwrap())
}

#[test]
fn brake_needs_both_conditions() {
    let b = Brake::default();
    assert!(!b.holds(5, 10)); // 50% but only 5
    assert!(!b.holds(6, 100)); // 6 users but 6%
    assert!(b.holds(6, 50));
    assert!(!b.holds(0, 0));
}

#[test]
fn budget_is_the_larger_of_the_floor_and_the_share() {
    let b = Brake::default();
    assert_eq!((b.limit(0), b.limit(4), b.limit(59), b.limit(60), b.limit(1000)), (5, 5, 5, 6, 100));
    assert_eq!(b.budget(1000).name, OFFBOARD_BUDGET);
}

#[test]
fn tenant_plan_onboards_missing_and_offboards_extra() {
    let r = reg();
    let t = &r.tenants[0];
    let members = BTreeMap::from([
        ("foo-users".to_string(), vec![user(1, "alice", &[]), user(2, "bob", &[])]),
        ("foo-ml".to_string(), vec![user(2, "bob", &[])]),
    ]);
    let actual = vec![acc("tenant-foo", "alice"), acc("tenant-foo", "carol"), acc("other", "zed")];
    let p = plan_tenant(&r, t, &members, &actual, &Drifted::new(), Some(Brake::default()));
    assert_eq!(p.unchanged, 1);
    assert_eq!(p.onboard.iter().map(|a| format!("{}/{}", a.account, a.username)).collect::<Vec<_>>(), ["ml-foo/bob"]);
    assert_eq!(
        p.offboard.iter().map(|a| format!("{}/{}", a.account, a.username)).collect::<Vec<_>>(),
        ["tenant-foo/carol"]
    );
    assert_eq!(p.onboard[0].member.as_ref().unwrap().uid_number, 4002);
}

#[test]
fn a_member_whose_limits_drifted_is_onboarded_again_and_a_leaver_only_offboarded() {
    let r = reg();
    let t = &r.tenants[0];
    let members = BTreeMap::from([
        ("foo-users".to_string(), vec![user(1, "alice", &[]), user(2, "bob", &[])]),
        ("foo-ml".to_string(), vec![]),
    ]);
    let actual = vec![acc("tenant-foo", "alice"), acc("tenant-foo", "bob"), acc("tenant-foo", "carol")];
    let drifted =
        Drifted::from([(acc("tenant-foo", "alice"), vec!["MaxJobs"]), (acc("tenant-foo", "carol"), vec!["QOS"])]);
    let p = plan_tenant(&r, t, &members, &actual, &drifted, Some(Brake::default()));
    assert_eq!(p.unchanged, 1, "{p:#?}");
    let ops: Vec<String> =
        p.onboard.iter().chain(&p.offboard).map(|a| format!("{:?} {}/{}", a.op, a.account, a.username)).collect();
    assert_eq!(ops, ["Onboard tenant-foo/alice", "Offboard tenant-foo/carol"]);
    assert!(p.onboard[0].reason.contains("limits other than the tenant's: MaxJobs"), "{}", p.onboard[0].reason);
    assert_eq!(p.onboard[0].member.as_ref().map(|m| m.pk), Some(1));
}

#[test]
fn an_empty_group_trips_the_brake() {
    let r = reg();
    let actual: Vec<_> = (0..20).map(|i| acc("tenant-foo", &format!("u{i}"))).collect();
    let members = BTreeMap::from([("foo-users".to_string(), vec![]), ("foo-ml".to_string(), vec![])]);
    let p = plan_tenant(&r, &r.tenants[0], &members, &actual, &Drifted::new(), Some(Brake::default()));
    assert!(p.offboard.is_empty());
    assert_eq!(p.held.len(), 20);
    assert!(p.brake_reason.unwrap().contains("20 of 20"));
    let p = plan_tenant(&r, &r.tenants[0], &members, &actual, &Drifted::new(), None);
    assert_eq!(p.offboard.len(), 20);
}

#[test]
fn user_plan() {
    let r = reg();
    let alice = Username::parse("alice").unwrap();
    let u = user(1, "alice", &["foo-users"]);
    let (a, why) = plan_user(&r, Some(&u), &alice, &[], &Drifted::new());
    assert_eq!((a.len(), a[0].op), (1, Op::Onboard), "{why}");
    let (a, why) = plan_user(&r, Some(&u), &alice, &[acc("tenant-foo", "alice")], &Drifted::new());
    assert!(a.is_empty() && why.starts_with("nothing to do"));
    let (a, why) = plan_user(&r, None, &alice, &[acc("tenant-foo", "alice")], &Drifted::new());
    assert_eq!(a[0].op, Op::Offboard);
    assert!(why.contains("not in authentik"), "{why}");
    let drifted = Drifted::from([(acc("tenant-foo", "alice"), vec!["MaxJobs"])]);
    let (a, why) = plan_user(&r, Some(&u), &alice, &[acc("tenant-foo", "alice")], &drifted);
    assert_eq!((a.len(), a[0].op), (1, Op::Onboard), "{why}");
    assert!(why.contains("limits other than the tenant's: maxjobs"), "{why}");
    let (a, _) = plan_user(&r, None, &alice, &[acc("tenant-foo", "alice")], &drifted);
    assert_eq!(a.iter().map(|a| a.op).collect::<Vec<_>>(), [Op::Offboard]);
    let moved = user(1, "alice", &["foo-users", "foo-ml"]);
    let (a, _) = plan_user(&r, Some(&moved), &alice, &[acc("tenant-foo", "alice")], &Drifted::new());
    assert_eq!(a.iter().map(|a| a.op).collect::<Vec<_>>(), [Op::Onboard, Op::Offboard]);
}
