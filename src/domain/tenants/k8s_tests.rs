//! The registry's Kubernetes names: the runbook's defaults, the registry-wide and per-tenant
//! overrides, the older `login_pod` block, and the mistakes (bad names, collisions).

use super::{K8sNames, TenantRegistry};

fn names(yaml: &str) -> Vec<K8sNames> {
    let r = TenantRegistry::parse(yaml, "t.yaml").unwrap_or_else(|e| panic!("{e}"));
    r.tenants.into_iter().map(|t| t.kubernetes).collect()
}

fn mistakes(yaml: &str) -> Vec<String> {
    TenantRegistry::parse(yaml, "t.yaml").unwrap_err().mistakes.iter().map(|m| m.to_string()).collect()
}

fn s(v: &str) -> Option<String> {
    Some(v.to_string())
}

#[test]
fn the_runbooks_names_by_default() {
    let n = names("tenants:\n  - { name: foo, group: g1 }\n  - { name: bar, group: g2, account: acct-bar }\n");
    assert_eq!(
        n[0],
        K8sNames {
            namespace: "tenant-foo".into(),
            keys_secret: "tenant-foo-authorized-keys".into(),
            network_policy: "tenant-foo-isolation".into(),
            login_deployment: "login".into(),
            login_pod: s("login-0"),
            login_container: None,
            slurm_cluster: "cluster-tenant-foo".into(),
            reservation: "tenant-foo-reservation".into(),
            reservation_namespace: s("tenant-foo"),
            node_label: "tenant-foo".into(),
        }
    );
    // the namespace follows the name, the Slurm-side names the account
    let bar = &n[1];
    assert_eq!((bar.namespace.as_str(), bar.keys_secret.as_str()), ("tenant-bar", "tenant-bar-authorized-keys"));
    assert_eq!((bar.slurm_cluster.as_str(), bar.reservation.as_str()), ("cluster-acct-bar", "acct-bar-reservation"));
    assert_eq!(bar.node_label, "acct-bar");
}

#[test]
fn registry_wide_defaults_and_each_tenants_own_names() {
    let n = names(
        "kubernetes: { login_pod: \"\", login_container: shell, slurm_cluster: \"{name}-slurm\", reservation_namespace: \"-\" }
tenants:
  - name: foo
    group: g1
    kubernetes:
      namespace: foo
      keys_secret: ssh-keys
      login_container: sshd
      node_label: pool-a
  - { name: bar, group: g2 }
",
    );
    let (foo, bar) = (&n[0], &n[1]);
    assert_eq!((foo.namespace.as_str(), foo.keys_secret.as_str()), ("foo", "ssh-keys"));
    assert_eq!((foo.network_policy.as_str(), foo.node_label.as_str()), ("foo-isolation", "pool-a"));
    // the tenant's own value wins over the registry-wide one
    assert_eq!((foo.login_container.clone(), bar.login_container.clone()), (s("sshd"), s("shell")));
    // "": a Ready pod of the login Deployment; "-": a cluster-scoped Reservation
    assert_eq!((foo.login_pod.clone(), foo.reservation_namespace.clone()), (None, None));
    assert_eq!((foo.slurm_cluster.as_str(), bar.slurm_cluster.as_str()), ("foo-slurm", "bar-slurm"));
    assert_eq!(bar.keys_secret, "tenant-bar-authorized-keys");
}

#[test]
fn the_older_login_pod_block_still_names_the_login_pod() {
    let n = names(
        "tenants:\n  - name: foo\n    group: g\n    login_pod: { namespace: tenant-foo, deployment: login, container: sshd }\n",
    );
    assert_eq!((n[0].namespace.as_str(), n[0].login_deployment.as_str()), ("tenant-foo", "login"));
    assert_eq!((n[0].login_pod.clone(), n[0].login_container.clone()), (None, s("sshd")));
    let both = "tenants:\n  - name: foo\n    group: g\n    login_pod: { namespace: a, deployment: login }\n    \
                kubernetes: { namespace: b }\n";
    let m = mistakes(both);
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(m[0].starts_with("line 4: tenants[0].login_pod: set the login pod in one place"), "{m:?}");
    let bad = "tenants:\n  - name: foo\n    group: g\n    login_pod: { namespace: Tenant_Foo, deployment: login }\n";
    assert_eq!(
        mistakes(bad),
        [
            "line 4: tenants[0].login_pod.namespace: \"Tenant_Foo\" is not a Kubernetes name (lower-case letters, digits and -, at most 63)"
        ]
    );
}

#[test]
fn a_name_kubernetes_refuses_says_where_it_came_from_and_what_to_set() {
    // a Slurm account may hold `_`; a custom resource's name may not
    let m = mistakes("tenants:\n  - { name: foo, group: g, account: ml_foo }\n");
    assert_eq!(
        m,
        [
            "line 2: tenants[0].kubernetes.slurm_cluster: \"cluster-ml_foo\" (the default, cluster-{account}) is not a \
             Kubernetes name (lower-case letters, digits, - and .); set tenants[0].kubernetes.slurm_cluster",
            "line 2: tenants[0].kubernetes.reservation: \"ml_foo-reservation\" (the default, {account}-reservation) is \
             not a Kubernetes name (lower-case letters, digits, - and .); set tenants[0].kubernetes.reservation",
        ]
    );
    // a placeholder that does not exist: said once, at the registry-wide field
    let m = mistakes(
        "kubernetes:\n  slurm_cluster: \"cluster-{tenant}\"\ntenants:\n  - { name: a, group: g1 }\n  - { name: b, group: g2 }\n",
    );
    assert_eq!(m, ["line 2: kubernetes.slurm_cluster: {tenant} is not one of {name}, {account}, {namespace}"]);
    // a bad namespace is the one mistake (the names after it use it)
    let m = mistakes("tenants:\n  - name: foo\n    group: g\n    kubernetes:\n      namespace: Foo\n");
    assert_eq!(
        m,
        [
            "line 5: tenants[0].kubernetes.namespace: \"Foo\" is not a Kubernetes name (lower-case letters, digits and -, at most 63)"
        ]
    );
}

#[test]
fn two_tenants_may_not_share_a_namespace_a_reservation_or_a_node_label() {
    let e = TenantRegistry::parse(
        "tenants:\n  - { name: foo, group: g1 }\n  - name: bar\n    group: g2\n    kubernetes: { namespace: tenant-foo }\n",
        "t.yaml",
    )
    .unwrap_err();
    // one line: the setting and the fix
    assert_eq!(
        e.to_string(),
        "tenant registry t.yaml: line 5: tenants[1].kubernetes.namespace: namespace tenant-foo is already tenant \
         foo's; two tenants cannot share it: set tenants[1].kubernetes.namespace"
    );
    let m = mistakes(
        "kubernetes: { reservation: shared, reservation_namespace: \"-\" }
tenants:
  - { name: foo, group: g1, kubernetes: { node_label: pool } }
  - { name: bar, group: g2, kubernetes: { node_label: pool } }
",
    );
    assert_eq!(
        m,
        [
            "line 4: tenants[1].kubernetes.reservation: reservation shared (cluster-scoped) is already tenant foo's; two tenants \
             cannot share it: set tenants[1].kubernetes.reservation",
            "line 4: tenants[1].kubernetes.node_label: node_label pool is already tenant foo's; two tenants cannot \
             share it: set tenants[1].kubernetes.node_label",
        ]
    );
}
