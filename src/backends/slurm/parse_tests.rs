//! The parsers on outputs recorded from Slurm 22.05.8 (see docs/slurm.md).

use super::*;
use crate::backends::slurm::SlurmError;

fn out(code: i32, stdout: &str, stderr: &str) -> Output {
    Output { code, stdout: stdout.into(), stderr: stderr.into() }
}

#[test]
fn successful_writes_are_done() {
    let added = " Adding Account(s)\n  tenant-foo\n Settings\n  Description     = tenant foo\n";
    assert_eq!(outcome("c", &out(0, added, "")).unwrap(), Outcome::Done);
    let modified = " Modified user associations...\n  C = production A = ml-team-foo           U = alice\n";
    assert_eq!(outcome("c", &out(0, modified, "")).unwrap(), Outcome::Done);
}

#[test]
fn nothing_new_modified_or_deleted_are_outcomes() {
    assert_eq!(outcome("c", &out(1, " Nothing new added.\n", "")).unwrap(), Outcome::Exists);
    assert_eq!(outcome("c", &out(1, " Nothing modified\n", "")).unwrap(), Outcome::NothingModified);
    assert_eq!(outcome("c", &out(1, " Nothing deleted\n", "")).unwrap(), Outcome::NothingDeleted);
}

#[test]
fn a_missing_account_wins_over_nothing_new_added() {
    // add user with a missing account, recorded: the error on stderr, "Nothing new added" on stdout.
    let e = outcome(
        "c",
        &out(
            1,
            " Nothing new added.\n",
            " This account 'x' doesn't exist.\n        Contact your admin to add this account.\n",
        ),
    )
    .unwrap_err();
    assert!(matches!(&e, SlurmError::MissingAccount(a) if a == "x"), "{e:?}");
    assert!(!e.is_retryable());
    let e = outcome("c", &out(1, "", " This account 'x' doesn't exist.\n No associations or wckeys created.\n"))
        .unwrap_err();
    assert!(matches!(e, SlurmError::MissingAccount(_)));
}

#[test]
fn recorded_errors_are_classified() {
    let e = outcome(
        "c",
        &out(1, "", " Parent account 'nonexist' doesn't exist on cluster production\n        Contact your admin to add this account.\n No associations created.\n"),
    )
    .unwrap_err();
    assert!(matches!(&e, SlurmError::MissingParent(p) if p == "nonexist"), "{e:?}");

    let e = outcome(
        "c",
        &out(1, "", "sacctmgr: error: slurmdb_format_tres_str: no TRES known by type gres/foo\n Unknown option: GrpTRES=gres/foo=3\n"),
    )
    .unwrap_err();
    assert_eq!(e.kind(), "unknown_tres");

    let e = outcome(
        "c",
        &out(
            1,
            "",
            "sacctmgr: error: You gave a bad qos 'nosuch'. Valid QOS's are normal\n Unknown option: qos=nosuch\n",
        ),
    )
    .unwrap_err();
    assert_eq!(e.kind(), "unknown_qos");
    let e = outcome("c", &out(1, "", "You gave a bad default qos 'nosuch'.  Use 'list qos' to get complete list.\n"))
        .unwrap_err();
    assert_eq!(e.kind(), "unknown_qos");

    let e = outcome(
        "c",
        &out(1, "", " Error with request: Job(s) active, cancel job(s) before remove\n  JobID = 8          C = production A = probe-team U = onramp-alice\n  JobID = 9          C = production A = probe-team U = onramp-alice\n"),
    )
    .unwrap_err();
    assert!(matches!(&e, SlurmError::JobsActive { jobs, .. } if jobs == &["8", "9"]), "{e:?}");

    let e = outcome("c", &out(1, " Can't modify because these users aren't associated with new default account 'x'...\n  U = u C = production\n", ""))
        .unwrap_err();
    assert!(matches!(e, SlurmError::MissingAccount(_)));

    let e = outcome("c", &out(1, "", "scancel: error: Invalid user name: nosuchuser\n")).unwrap_err();
    assert_eq!(e.kind(), "unknown_unix_user");

    let e = outcome("c", &out(1, "", " dump: Failed to stat /tmp/x: No such file or directory\n Note: For archive dump, the directory must be on the calling host.\n"))
        .unwrap_err();
    assert!(matches!(&e, SlurmError::Failed { detail, .. } if detail.contains("Failed to stat")), "{e:?}");
    assert!(!e.is_retryable());
}

#[test]
fn unreachable_daemons_are_retryable() {
    let dbd = "sacctmgr: error: slurm_persist_conn_open_without_init: failed to open persistent connection to host:localhost:6819: Connection refused\nsacctmgr: error: Sending PersistInit msg: Connection refused\n";
    let e = outcome("c", &out(1, "", dbd)).unwrap_err();
    assert!(e.is_retryable() && e.kind() == "unreachable", "{e:?}");
    let e = read_ok("c", &out(1, "", dbd)).unwrap_err();
    assert!(e.is_retryable());
    let ctld = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n";
    assert!(read_ok("c", &out(1, "", ctld)).unwrap_err().is_retryable());
    assert!(outcome("c", &out(1, "", ctld)).unwrap_err().is_retryable());
}

#[test]
fn squeue_of_an_unknown_user_is_an_error_though_rc_is_0() {
    let e = read_ok("c", &out(0, "", "squeue: error: Invalid user: nosuchuser\n\n")).unwrap_err();
    assert_eq!(e.kind(), "unknown_unix_user");
    assert_eq!(read_ok("c", &out(0, "", "")).unwrap(), "");
}

#[test]
fn association_rows() {
    let rows = assocs(
        "c",
        "production|tenant-foo|||root|300|200||cpu=8,gres/gpu=4||||normal|\nproduction|ml-team-foo|alice|||parent|0|||gres/gpu=10000|0|0|normal,high|normal\n",
    )
    .unwrap();
    assert_eq!(rows.len(), 2);
    let (t, a) = (&rows[0], &rows[1]);
    assert_eq!((t.account.as_str(), t.user.as_str(), t.parent.as_str()), ("tenant-foo", "", "root"));
    assert_eq!((t.fairshare, t.grp_jobs, t.max_jobs), (Fairshare::Shares(300), Limit::At(200), Limit::Unlimited));
    assert_eq!(t.grp_tres.get("gres/gpu"), Some(4));
    assert_eq!(
        (a.fairshare, a.grp_jobs, a.max_jobs, a.max_submit_jobs),
        (Fairshare::Parent, Limit::At(0), Limit::At(0), Limit::At(0))
    );
    assert_eq!(a.qos, ["high", "normal"]);
    assert_eq!(a.grp_tres_mins.get("gres/gpu"), Some(10000));
    assert!(a.is_blocked() && !t.is_blocked());
    assert!(assocs("c", "").unwrap().is_empty());
    assert!(assocs("c", "production|a|b\n").is_err());
    assert!(assocs("c", "production|a||||x|||||||normal|\n").is_err());
}

#[test]
fn account_and_user_rows() {
    let a = accounts("c", "tenant foo|tenant-foo|production|tenant-foo|||root|300|200||cpu=8,gres/gpu=4||||normal|\n")
        .unwrap();
    assert_eq!((a[0].description.as_str(), a[0].assoc.grp_jobs), ("tenant foo", Limit::At(200)));
    let u = user_assocs("c", "ml-team-foo|production|ml-team-foo|alice|||parent||||gres/gpu=10000|20||normal|normal\n")
        .unwrap();
    assert_eq!(u[0].0, "ml-team-foo");
    assert_eq!(u[0].1.max_jobs, Limit::At(20));
}

#[test]
fn squeue_rows() {
    let j =
        jobs("c", "3|alice|ml-team-foo|PENDING|Resources\n4|alice|ml-team-foo|RUNNING|None\n5|bob|x|COMPLETING|None\n")
            .unwrap();
    assert_eq!(j.len(), 3);
    assert_eq!((j[0].id.as_str(), &j[0].state, j[0].reason.as_str()), ("3", &SlurmJobState::Pending, "Resources"));
    assert_eq!(j[1].state, SlurmJobState::Running);
    assert_eq!(j[2].state, SlurmJobState::Completing);
    assert!(jobs("c", "3|alice\n").is_err());
}

#[test]
fn config_and_cgroup_conf() {
    let c = config(
        "Configuration data as of 2026-11-30T00:07:22\nAccountingStorageEnforce = associations,limits,qos,safe\nPriorityFlags           =\nPrologFlags             = (null)\nSlurmctldHost[0]        = vm(localhost)\n\nSlurmctld(primary) at vm is UP\n",
    );
    assert_eq!(c["AccountingStorageEnforce"], "associations,limits,qos,safe");
    assert_eq!(c["PriorityFlags"], "");
    assert_eq!(c["PrologFlags"], "");
    let g = cgroup_conf(
        "# comment\nCgroupPlugin=autodetect\nConstrainDevices = yes # the critical line\nconstraincores=no\n",
    );
    assert_eq!((g["constraindevices"].as_str(), g["constraincores"].as_str()), ("yes", "no"));
}
