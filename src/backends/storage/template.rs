//! Argv templates for the `command` backend: a setting split on whitespace into argv elements,
//! with `{placeholder}`s replaced inside each element. Never a shell string: a substituted
//! value stays inside its one element, whatever it contains.

use std::collections::BTreeMap;

use crate::backends::exec::Command;

pub const PLACEHOLDERS: &[&str] = &["path", "user", "tenant", "fs", "name", "hard", "soft", "hard_bytes", "soft_bytes"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(Vec<String>);

impl Template {
    pub fn parse(s: &str) -> Result<Self, String> {
        let parts: Vec<String> = s.split_whitespace().map(Into::into).collect();
        if parts.is_empty() {
            return Err("a command template must not be empty".into());
        }
        if parts[0].contains('{') {
            return Err(format!("the program in {s:?} must be fixed, not a placeholder"));
        }
        for p in &parts {
            let mut rest = p.as_str();
            while let Some(i) = rest.find('{') {
                let Some(j) = rest[i..].find('}') else {
                    return Err(format!("unclosed {{ in {p:?}"));
                };
                let name = &rest[i + 1..i + j];
                if !PLACEHOLDERS.contains(&name) {
                    return Err(format!("unknown placeholder {{{name}}}; known: {}", PLACEHOLDERS.join(", ")));
                }
                rest = &rest[i + j + 1..];
            }
        }
        Ok(Self(parts))
    }

    /// Replaces placeholders element by element; unset ones become empty.
    pub fn render(&self, vars: &BTreeMap<&'static str, String>) -> Command {
        let render = |p: &String| {
            PLACEHOLDERS
                .iter()
                .fold(p.clone(), |acc, k| acc.replace(&format!("{{{k}}}"), vars.get(k).map_or("", |v| v)))
        };
        Command::new(&self.0[0]).args(self.0[1..].iter().map(render))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_stay_in_their_element() {
        let t = Template::parse("setq --path={path} {hard}").unwrap();
        let vars = BTreeMap::from([("path", "/a b;rm -rf /".to_string()), ("hard", "1GB".to_string())]);
        assert_eq!(t.render(&vars).argv(), ["setq", "--path=/a b;rm -rf /", "1GB"]);
        assert!(Template::parse("").is_err());
        assert!(Template::parse("{path} x").is_err());
        assert!(Template::parse("x {nope}").unwrap_err().contains("unknown placeholder"));
        assert!(Template::parse("x {path").is_err());
    }
}
