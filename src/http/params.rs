//! Query and path parameters read with messages that name the parameter and say what it takes
//! ("limit must be a whole number from 1 to 500, not \"abc\""), never a parser's own wording.

use std::ops::RangeInclusive;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::Problem;

/// A whole number in `range`.
pub fn whole(name: &str, raw: &str, range: RangeInclusive<i64>) -> Result<i64, Problem> {
    let what = || {
        let (lo, hi) = (range.start(), range.end());
        let span = if *hi == i64::MAX { format!("of at least {lo}") } else { format!("from {lo} to {hi}") };
        Problem::bad_request(format!("{name} must be a whole number {span}, not {}", shown(raw)))
    };
    let n: i64 = raw.trim().parse().map_err(|_| what())?;
    if range.contains(&n) { Ok(n) } else { Err(what()) }
}

/// A job id in the path.
pub fn job_id(raw: &str) -> Result<i64, Problem> {
    raw.parse::<i64>().map_err(|_| Problem::bad_request(format!("a job id is a whole number, not {}", shown(raw))))
}

/// A point in time, RFC 3339.
pub fn time(name: &str, raw: &str) -> Result<OffsetDateTime, Problem> {
    OffsetDateTime::parse(raw.trim(), &Rfc3339).map_err(|_| {
        Problem::bad_request(format!(
            "{name} must be a time in RFC 3339 form with its offset, such as 2026-11-30T14:00:00Z, not {}",
            shown(raw)
        ))
    })
}

/// One of `allowed`.
pub fn one_of<'a>(name: &str, raw: &'a str, allowed: &[&str]) -> Result<&'a str, Problem> {
    if allowed.contains(&raw) {
        return Ok(raw);
    }
    Err(Problem::bad_request(format!("{name} must be one of {}, not {}", allowed.join(", "), shown(raw))))
}

/// A value as a message quotes it: shortened, control characters escaped.
fn shown(raw: &str) -> String {
    let cut: String = raw.chars().take(60).collect();
    let more = if raw.chars().count() > 60 { "…" } else { "" };
    format!("{:?}{more}", cut)
}

/// A query string that did not fit the route's parameters, said in the API's words.
pub fn query_problem(text: &str) -> Problem {
    let msg = text.strip_prefix("Failed to deserialize query string: ").unwrap_or(text);
    let tick = |s: &str| s.split('`').nth(1).map(str::to_string);
    let after = |marker: &str| msg.find(marker).map(|i| &msg[i + marker.len()..]);
    let detail = if let Some(rest) = after("missing field ") {
        format!("the query parameter {} is required", tick(rest).unwrap_or_default())
    } else if let Some(rest) = after("unknown field ") {
        let name = tick(rest).unwrap_or_default();
        let known: Vec<&str> = rest.split("expected one of ").nth(1).unwrap_or("").split(", ").collect();
        let known: Vec<String> = known.iter().filter_map(|k| tick(k)).collect();
        format!("unknown query parameter {name:?}; this route takes {}", known.join(", "))
    } else if let Some((name, why)) = msg.split_once(": ") {
        let takes = if why.contains("true") && why.contains("false") {
            "true or false".to_string()
        } else if why.contains("digit") || why.contains("number") {
            "a whole number".to_string()
        } else {
            "a different value".to_string()
        };
        format!("the query parameter {name} must be {takes}")
    } else {
        format!("the query string cannot be read: {msg}")
    };
    Problem::bad_request(detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_parameter_and_what_it_takes() {
        assert_eq!(
            whole("limit", "0", 1..=500).unwrap_err().detail,
            "limit must be a whole number from 1 to 500, not \"0\""
        );
        assert_eq!(whole("limit", "500", 1..=500).unwrap(), 500);
        assert!(whole("before", "abc", 1..=i64::MAX).unwrap_err().detail.contains("of at least 1"));
        assert!(job_id("abc").unwrap_err().detail.starts_with("a job id is a whole number"));
        assert!(time("created_since", "yesterday").unwrap_err().detail.contains("RFC 3339"));
        let p =
            query_problem("Failed to deserialize query string: hard_cutoff: provided string was not `true` or `false`");
        assert_eq!(p.detail, "the query parameter hard_cutoff must be true or false");
        let p = query_problem("Failed to deserialize query string: missing field `tenant`");
        assert_eq!(p.detail, "the query parameter tenant is required");
        let p =
            query_problem("Failed to deserialize query string: x: unknown field `x`, expected one of `tenant`, `user`");
        assert_eq!(p.detail, "unknown query parameter \"x\"; this route takes tenant, user");
    }
}
