//! What a verified delivery says, as hints: which users or groups may have changed. Authentik's
//! events are never the truth (see docs/authentik.md); reconcile jobs re-read it.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::flows::reconcile::Subject;

/// The delivery's body, understood as far as it can be.
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed {
    /// structured (our blueprint's mapping) | default (Authentik's default body) | unknown
    pub shape: &'static str,
    pub event_uuid: Option<String>,
    pub action: Option<String>,
    /// `app.model_name`, e.g. `authentik_core.user`.
    pub model: Option<String>,
    /// Whom to reconcile.
    pub subjects: Vec<Subject>,
}

/// The actions after which a user's or group's state may differ.
const CHANGES: [&str; 4] = ["model_created", "model_updated", "model_deleted", "user_write"];

/// Reads a JSON object (the caller has already refused anything else). A group's diff listing
/// more than `max_users` users points at the whole group instead of at each user (one job, not
/// one per user; the group's tenants are reconciled, with their brake).
pub fn parse(body: &Value, max_users: usize) -> Parsed {
    let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    if let Some(action) = body.get("action").and_then(Value::as_str) {
        let context = body.get("context");
        let model = body.get("model").filter(|m| m.is_object()).or_else(|| context.and_then(|c| c.get("model")));
        let diff = body.get("diff").filter(|d| d.is_object()).or_else(|| context.and_then(|c| c.get("diff")));
        let app = model.and_then(|m| m.get("app")).and_then(Value::as_str);
        let model_name = model.and_then(|m| m.get("model_name")).and_then(Value::as_str);
        let subjects = structured_subjects(action, app, model_name, model, diff, body.get("actor"), max_users);
        return Parsed {
            shape: "structured",
            event_uuid: s(body.get("event_uuid")).filter(|u| !u.is_empty() && u.len() <= 64),
            action: Some(action.to_string()),
            model: app.zip(model_name).map(|(a, m)| format!("{a}.{m}")),
            subjects,
        };
    }
    if body.get("body").is_some_and(Value::is_string) && body.get("severity").is_some() {
        // The default body: a summary "<action>: {python repr}" or the event's message, with the
        // notification's recipient and the event's actor; no id, no structured context.
        let summary = body["body"].as_str().unwrap_or_default();
        let action =
            summary.split_once(": ").map(|(a, _)| a).filter(|a| a.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
        let subjects = match action {
            Some(a) if CHANGES.contains(&a) => vec![Subject::Everything],
            _ => vec![],
        };
        return Parsed {
            shape: "default",
            event_uuid: None,
            action: action.map(str::to_string),
            model: None,
            subjects,
        };
    }
    Parsed { shape: "unknown", event_uuid: None, action: None, model: None, subjects: vec![] }
}

fn structured_subjects(
    action: &str,
    app: Option<&str>,
    model_name: Option<&str>,
    model: Option<&Value>,
    diff: Option<&Value>,
    actor: Option<&Value>,
    max_users: usize,
) -> Vec<Subject> {
    if !CHANGES.contains(&action) {
        return vec![];
    }
    if action == "user_write" {
        return match actor.and_then(|a| a.get("pk")).and_then(Value::as_i64) {
            Some(pk) => vec![Subject::User { pk }],
            None => vec![Subject::Everything],
        };
    }
    if app != Some("authentik_core") {
        return vec![];
    }
    match model_name {
        Some("user") => match model.and_then(|m| m.get("pk")).and_then(pk_of) {
            Some(pk) => vec![Subject::User { pk }],
            None => vec![Subject::Everything],
        },
        Some("group") => {
            // Enterprise builds send diff.users {add: [pk…], remove: [pk…]}; without it the
            // whole group is looked at again.
            // Past `max_users` distinct users, the whole group (memory and locks stay bounded).
            let users = diff.and_then(|d| d.get("users"));
            let mut pks = std::collections::BTreeSet::new();
            for pk in ["add", "remove"]
                .iter()
                .filter_map(|k| users.and_then(|u| u.get(*k)).and_then(Value::as_array))
                .flatten()
                .filter_map(pk_of)
            {
                pks.insert(pk);
                if pks.len() > max_users {
                    break;
                }
            }
            if !pks.is_empty() && pks.len() <= max_users {
                return pks.into_iter().map(|pk| Subject::User { pk }).collect();
            }
            match model.and_then(|m| m.get("name")).and_then(Value::as_str) {
                Some(name) if !name.is_empty() => vec![Subject::Group { name: name.to_string() }],
                _ => vec![Subject::Everything],
            }
        }
        _ => vec![],
    }
}

/// Replaces every U+0000 in the body's strings and keys with U+FFFD: neither jsonb nor text
/// columns can hold it. True when anything changed (the caller then keeps the raw bytes too).
pub fn scrub_nul(v: &mut Value) -> bool {
    const NUL: char = '\0';
    match v {
        Value::String(s) if s.contains(NUL) => {
            *s = s.replace(NUL, "\u{FFFD}");
            true
        }
        Value::Array(items) => items.iter_mut().fold(false, |changed, x| scrub_nul(x) | changed),
        Value::Object(map) if map.keys().any(|k| k.contains(NUL)) => {
            for (k, mut x) in std::mem::take(map) {
                scrub_nul(&mut x);
                map.insert(k.replace(NUL, "\u{FFFD}"), x);
            }
            true
        }
        Value::Object(map) => map.values_mut().fold(false, |changed, x| scrub_nul(x) | changed),
        _ => false,
    }
}

fn pk_of(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

/// The key a delivery is deduplicated on: the event's uuid, else the signed `webhook-id`, else a
/// digest of the body within the hour (the default body has no id; retries come within the hour).
pub fn delivery_key(parsed: &Parsed, webhook_id: Option<&str>, raw: &[u8], now_unix: i64) -> String {
    if let Some(u) = &parsed.event_uuid {
        return format!("event:{u}");
    }
    if let Some(id) = webhook_id {
        return format!("webhook-id:{id}");
    }
    let digest = Sha256::digest(raw);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("body:{hex}:{}", now_unix / 3600)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn structured(action: &str, model: Value, diff: Option<Value>) -> Value {
        let mut context = json!({ "model": model, "http_request": { "path": "/api/v3/x/", "method": "PATCH" } });
        if let Some(d) = diff {
            context["diff"] = d;
        }
        json!({ "event_uuid": "6f1c0d5e9a8b4c3d8e7f6a5b4c3d2e1f", "action": action, "app": "authentik.events.models",
                "actor": { "pk": 1, "username": "akadmin" }, "model": context["model"].clone(), "context": context,
                "created": "2026-11-30T00:00:00+00:00" })
    }

    #[test]
    fn user_event_points_at_the_user() {
        let b = structured(
            "model_updated",
            json!({"app": "authentik_core", "model_name": "user", "pk": 42, "name": "Alice A"}),
            None,
        );
        let p = parse(&b, 200);
        assert_eq!(p.shape, "structured");
        assert_eq!(p.subjects, vec![Subject::User { pk: 42 }]);
        assert_eq!(p.model.as_deref(), Some("authentik_core.user"));
        assert_eq!(p.event_uuid.as_deref(), Some("6f1c0d5e9a8b4c3d8e7f6a5b4c3d2e1f"));
    }

    #[test]
    fn group_event_with_diff_points_at_the_users_and_without_at_the_group() {
        let g = json!({"app": "authentik_core", "model_name": "group", "pk": "9a4f0c2e1b7d4e3f8a6b5c4d3e2f1a0b", "name": "tenant-foo-users"});
        let with = structured("model_updated", g.clone(), Some(json!({"users": {"add": [7, 9], "remove": [3]}})));
        assert_eq!(
            parse(&with, 200).subjects,
            vec![Subject::User { pk: 3 }, Subject::User { pk: 7 }, Subject::User { pk: 9 }]
        );
        let without = structured("model_updated", g, None);
        assert_eq!(parse(&without, 200).subjects, vec![Subject::Group { name: "tenant-foo-users".into() }]);
    }

    #[test]
    fn unknown_actions_and_models_point_nowhere() {
        let b = structured("login", json!({"app": "authentik_core", "model_name": "user", "pk": 1, "name": "x"}), None);
        assert!(parse(&b, 200).subjects.is_empty());
        let b =
            structured("model_updated", json!({"app": "authentik_core", "model_name": "application", "pk": "x"}), None);
        assert!(parse(&b, 200).subjects.is_empty());
        assert_eq!(parse(&json!({"hello": 1}), 200).shape, "unknown");
    }

    #[test]
    fn default_body_means_reconcile_everything_for_model_changes() {
        let b = json!({"body": "model_updated: {'model': {'app': 'authentik_core', 'model_name': 'user', 'pk': 42, 'name': 'Alice'}}",
                       "severity": "notice", "user_email": "ops@example.org", "user_username": "ops",
                       "event_user_email": "admin@example.org", "event_user_username": "akadmin"});
        let p = parse(&b, 200);
        assert_eq!((p.shape, p.action.as_deref()), ("default", Some("model_updated")));
        assert_eq!(p.subjects, vec![Subject::Everything]);
        let login = json!({"body": "login_failed: {'username': 'x'}", "severity": "warning"});
        assert!(parse(&login, 200).subjects.is_empty());
    }

    #[test]
    fn delivery_keys_prefer_the_event_then_the_id_then_the_body() {
        let p = parse(
            &structured("model_updated", json!({"app": "authentik_core", "model_name": "user", "pk": 1}), None),
            200,
        );
        assert_eq!(delivery_key(&p, Some("msg_1"), b"{}", 0), "event:6f1c0d5e9a8b4c3d8e7f6a5b4c3d2e1f");
        let d = parse(&json!({"body": "x", "severity": "notice"}), 200);
        assert_eq!(delivery_key(&d, Some("msg_1"), b"{}", 0), "webhook-id:msg_1");
        let k = delivery_key(&d, None, b"{}", 7200);
        assert!(k.starts_with("body:44136fa3") && k.ends_with(":2"), "{k}");
    }

    #[test]
    fn a_group_diff_past_the_limit_points_at_the_group_or_everything() {
        let g = json!({"app": "authentik_core", "model_name": "group", "pk": "9a4f", "name": "tenant-foo-users"});
        let diff = json!({"users": {"add": [1, 2, 3], "remove": ["4", 4]}});
        let at = structured("model_updated", g.clone(), Some(diff.clone()));
        assert_eq!(parse(&at, 4).subjects.len(), 4);
        assert_eq!(parse(&at, 3).subjects, vec![Subject::Group { name: "tenant-foo-users".into() }]);
        let nameless = json!({"app": "authentik_core", "model_name": "group", "pk": "9a4f"});
        assert_eq!(parse(&structured("model_updated", nameless, Some(diff)), 3).subjects, vec![Subject::Everything]);
    }

    #[test]
    fn stored_targets_read_back_as_the_same_subjects() {
        let subjects =
            [Subject::User { pk: -3 }, Subject::Group { name: "tenant:odd name".into() }, Subject::Everything];
        for s in subjects {
            assert_eq!(Subject::from_target(&s.to_target()), Some(s.clone()), "{s:?}");
        }
        for junk in ["", "user:", "user:x", "group:", "User { pk: 1 }", "everything:"] {
            assert_eq!(Subject::from_target(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn scrubbing_replaces_nul_in_strings_and_keys_only_where_present() {
        let mut v = json!({"a\0": ["x\0y", 1, {"k": "\0"}], "b": "fine"});
        assert!(scrub_nul(&mut v));
        assert_eq!(v, json!({"a\u{FFFD}": ["x\u{FFFD}y", 1, {"k": "\u{FFFD}"}], "b": "fine"}));
        assert!(!scrub_nul(&mut v));
    }
}
