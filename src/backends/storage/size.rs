//! Quota sizes as people write them: `100GB`, `50TB`, `512GiB`. Decimal units are powers of
//! 1000, binary (`KiB`…) powers of 1024. Kept as bytes plus the text the backend is given.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("{0:?} is not a size like 100GB or 50TB")]
    Shape(String),
    #[error("{0:?} is too large")]
    TooLarge(String),
    #[error("a quota of zero is not a quota")]
    Zero,
    #[error("soft limit {soft} is above hard limit {hard}")]
    SoftAboveHard { soft: Size, hard: Size },
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size {
    bytes: u64,
    /// Index into UNITS: the unit it was written in (for Weka's own syntax).
    unit: usize,
    number: u64,
}

const UNITS: &[(&str, u64)] = &[
    ("B", 1),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
    ("PB", 1_000_000_000_000_000),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("PiB", 1 << 50),
];

impl Size {
    pub fn parse(s: &str) -> Result<Self, SizeError> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let number: u64 = num.parse().map_err(|_| SizeError::Shape(s.into()))?;
        let idx = UNITS.iter().position(|(u, _)| u.eq_ignore_ascii_case(unit.trim()) && !unit.trim().is_empty());
        let Some(idx) = idx else {
            return Err(SizeError::Shape(s.into()));
        };
        let bytes = number.checked_mul(UNITS[idx].1).ok_or_else(|| SizeError::TooLarge(s.into()))?;
        Ok(Self { bytes, unit: idx, number })
    }
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    /// Whole KiB, rounded up (Lustre's `lfs setquota -b/-B` unit).
    pub fn kib(&self) -> u64 {
        self.bytes.div_ceil(1024)
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.number, UNITS[self.unit].0)
    }
}

impl fmt::Debug for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Size({self})")
    }
}

impl std::str::FromStr for Size {
    type Err = SizeError;
    fn from_str(s: &str) -> Result<Self, SizeError> {
        Self::parse(s)
    }
}

/// Hard and soft limits, checked: both non-zero, soft at most hard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    hard: Size,
    soft: Size,
}

impl Quota {
    pub fn new(hard: Size, soft: Size) -> Result<Self, SizeError> {
        if hard.bytes == 0 || soft.bytes == 0 {
            return Err(SizeError::Zero);
        }
        if soft.bytes > hard.bytes {
            return Err(SizeError::SoftAboveHard { soft, hard });
        }
        Ok(Self { hard, soft })
    }
    pub fn parse(hard: &str, soft: &str) -> Result<Self, SizeError> {
        Self::new(Size::parse(hard)?, Size::parse(soft)?)
    }
    pub fn hard(&self) -> Size {
        self.hard
    }
    pub fn soft(&self) -> Size {
        self.soft
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let s = Size::parse("100GB").unwrap();
        assert_eq!((s.bytes(), s.to_string()), (100_000_000_000, "100GB".into()));
        assert_eq!(Size::parse("50tb").unwrap().to_string(), "50TB");
        assert_eq!(Size::parse("1KiB").unwrap().kib(), 1);
        assert_eq!(Size::parse("1500B").unwrap().kib(), 2);
        for bad in ["", "GB", "100", "1.5TB", "-1GB", "100 XB", "10GBB"] {
            assert!(Size::parse(bad).is_err(), "{bad}");
        }
        assert!(matches!(Size::parse("99999999PB"), Err(SizeError::TooLarge(_))));
    }

    #[test]
    fn quotas() {
        assert!(Quota::parse("100GB", "90GB").is_ok());
        assert!(matches!(Quota::parse("90GB", "100GB"), Err(SizeError::SoftAboveHard { .. })));
        assert_eq!(Quota::parse("0GB", "0GB"), Err(SizeError::Zero));
        assert!(Quota::parse("1TiB", "1TB").is_ok());
    }
}
