//! Durations as settings write them: `500ms`, `10s`, `5m`, `2h`, `30d`.

use std::time::Duration;

/// Parses `500ms`, `10s`, `5m`, `2h`, `30d`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a duration like 500ms, 10s, 5m, 2h or 30d"))?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!("{s:?} has no unit: write it like 500ms, 10s, 5m, 2h or 30d"));
        }
    };
    n.checked_mul(ms).map(Duration::from_millis).ok_or_else(|| format!("{s:?} is too long"))
}

/// Formats a duration the way `parse_duration` reads it.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_trip() {
        for (s, ms) in [("500ms", 500), ("10s", 10_000), ("5m", 300_000), ("2h", 7_200_000), ("30d", 2_592_000_000)] {
            assert_eq!(parse_duration(s), Ok(Duration::from_millis(ms)));
            assert_eq!(format_duration(Duration::from_millis(ms)), s);
        }
        assert!(parse_duration("10").unwrap_err().contains("no unit"));
        assert!(parse_duration("ten s").is_err());
        assert!(parse_duration("99999999999999999d").unwrap_err().contains("too long"));
    }
}
