//! The intake's settings on the command line: listed in --help with environment and default;
//! mistakes are one clear message.

use crate::cli::onramp;

#[test]
fn serve_help_lists_the_intake_settings_with_defaults() {
    let o = onramp(&["serve", "--help"], &[]);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    for (env, default) in [
        ("ONRAMP_TENANTS", None),
        ("ONRAMP_AUTHENTIK_URL", None),
        ("ONRAMP_AUTHENTIK_TOKEN", None),
        ("ONRAMP_AUTHENTIK_TOKEN_FILE", None),
        ("ONRAMP_AUTHENTIK_TIMEOUT", Some("10s")),
        ("ONRAMP_AUTHENTIK_ATTEMPTS", Some("4")),
        ("ONRAMP_AUTHENTIK_CONCURRENCY", Some("32")),
        ("ONRAMP_WEBHOOK_SECRETS", None),
        ("ONRAMP_WEBHOOK_TOKENS", None),
        ("ONRAMP_WEBHOOK_TOLERANCE", Some("5m")),
        ("ONRAMP_WEBHOOK_MAX_BODY", Some("1048576")),
        ("ONRAMP_WEBHOOK_SETTLE", Some("2s")),
        ("ONRAMP_WEBHOOK_WRITERS", Some("1")),
        ("ONRAMP_WEBHOOK_BATCH", Some("512")),
        ("ONRAMP_RECONCILE_INTERVAL", Some("15m")),
        ("ONRAMP_BRAKE_MIN_USERS", Some("5")),
        ("ONRAMP_BRAKE_MAX_PERCENT", Some("10")),
        ("ONRAMP_SLURM_VIA", Some("kube-exec")),
        ("ONRAMP_SLURM_SSH_HOST", None),
        ("ONRAMP_SLURM_SSH_PORT", Some("22")),
        ("ONRAMP_SLURM_SSH_KEY_FILE", None),
        ("ONRAMP_SLURM_SSH_KNOWN_HOSTS", None),
    ] {
        let at = help.find(&format!("[env: {env}")).unwrap_or_else(|| panic!("{env} missing from help:\n{help}"));
        if let Some(d) = default {
            let end = help[at..].find(']').unwrap() + at;
            let before = &help[..end + 40.min(help.len() - end)];
            assert!(before[at..].contains(&format!("default: {d}")), "{env} default {d}: {}", &help[at..end + 30]);
        }
    }
    let o = onramp(&["reconcile", "--help"], &[]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("--tenant"));
}

#[test]
fn half_configured_intake_and_a_bad_registry_are_one_clear_error() {
    let o = onramp(
        &["reconcile"],
        &[("DATABASE_URL", "postgres://nobody@127.0.0.1:1/x"), ("ONRAMP_AUTHENTIK_URL", "https://auth.example.org")],
    );
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("missing setting ONRAMP_TENANTS, ONRAMP_AUTHENTIK_TOKEN(_FILE)"), "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "{e}");

    let dir = std::env::temp_dir().join(format!("onramp-cli-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tenants.yaml");
    std::fs::write(&file, "tenants:\n  - name: Foo\n    group: g\n").unwrap();
    let o = onramp(
        &["reconcile"],
        &[
            ("DATABASE_URL", "postgres://nobody@127.0.0.1:1/x"),
            ("ONRAMP_AUTHENTIK_URL", "https://auth.example.org"),
            ("ONRAMP_AUTHENTIK_TOKEN", "t"),
            ("ONRAMP_TENANTS", file.to_str().unwrap()),
        ],
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(e.contains("line 2: tenants[0].name: tenant name \"Foo\" is not allowed"), "{e}");

    // a malformed signing secret is named, never printed
    let file = std::env::temp_dir().join(format!("onramp-cli-{}.yaml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&file, "tenants:\n  - name: foo\n    group: g\n").unwrap();
    let o = onramp(
        &["serve", "--role", "api"],
        &[
            ("DATABASE_URL", "postgres://nobody@127.0.0.1:1/x"),
            ("ONRAMP_AUTHENTIK_URL", "https://auth.example.org"),
            ("ONRAMP_AUTHENTIK_TOKEN", "t"),
            ("ONRAMP_TENANTS", file.to_str().unwrap()),
            ("ONRAMP_WEBHOOK_SECRETS", "whsec_c2VjcmV0LXRoYXQtaXMtbm90LW91cnMtYXQtYWxs,whsec_!!topsecret"),
        ],
    );
    std::fs::remove_file(&file).unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(e.contains("ONRAMP_WEBHOOK_SECRETS entry 2: a signing secret is whsec_ followed by base64"), "{e}");
    assert!(!e.contains("topsecret") && !e.contains("c2VjcmV0"), "{e}");
}

#[test]
fn a_pool_too_small_for_the_connections_the_process_keeps_is_refused_before_connecting() {
    let file = std::env::temp_dir().join(format!("onramp-cli-{}.yaml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&file, "tenants:\n  - name: foo\n    group: g\n").unwrap();
    let env = |writers, pool| {
        [
            ("DATABASE_URL", "postgres://nobody@127.0.0.1:1/x"),
            ("ONRAMP_AUTHENTIK_URL", "https://auth.example.org"),
            ("ONRAMP_AUTHENTIK_TOKEN", "t"),
            ("ONRAMP_TENANTS", file.to_str().unwrap()),
            ("ONRAMP_WEBHOOK_SECRETS", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            ("ONRAMP_WEBHOOK_WRITERS", writers),
            ("ONRAMP_DB_POOL_SIZE", pool),
        ]
    };
    let o = onramp(&["serve", "--role", "both"], &env("6", "9"));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        e.contains("ONRAMP_DB_POOL_SIZE is 9: this process keeps 8 connections for good (6 webhook writers")
            && e.contains("set it to 10 or more"),
        "{e}"
    );
    // the same settings for an api process alone fit; it goes on to connect (and fails there)
    let o = onramp(&["serve", "--role", "api"], &env("6", "9"));
    std::fs::remove_file(&file).unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && !e.contains("ONRAMP_DB_POOL_SIZE") && e.contains("cannot connect to PostgreSQL"),
        "{e}"
    );
}
