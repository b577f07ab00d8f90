use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::*;

fn pod(mounts: serde_json::Value, volumes: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "main", "volumeMounts": mounts}], "volumes": volumes}}))
    .unwrap()
}

#[test]
fn the_deepest_mount_decides_what_backs_a_path() {
    let p = pod(
        json!([{"name": "etc", "mountPath": "/etc"}, {"name": "munge", "mountPath": "/etc/munge/"}]),
        json!([{"name": "etc", "configMap": {"name": "etc"}},
               {"name": "munge", "projected": {"sources": [{"secret": {"name": "munge-key"}}]}}]),
    );
    assert_eq!(backing(&p, None, MUNGE_KEY), Backing::Secret(vec!["munge-key".into()]));
    assert_eq!(backing(&p, None, NSLCD_CONF), Backing::Other("configMap etc".into()));
    assert_eq!(backing(&p, None, "/etcetera/x"), Backing::Image);
    assert_eq!(backing(&p, Some("other"), MUNGE_KEY), Backing::Image);
}

#[test]
fn the_id_scheme_is_the_mapping_lines_whatever_their_spacing_and_order() {
    let a = "uri ldap://a\nmap  passwd uidNumber uidNumber # x\nbase dc=x\n";
    let b = "base dc=x\nuri ldap://b\nmap passwd uidNumber   uidNumber\n";
    assert_eq!(id_scheme(a), id_scheme(b));
    assert_eq!(id_scheme(a), ["base dc=x", "map passwd uidNumber uidNumber"]);
}
