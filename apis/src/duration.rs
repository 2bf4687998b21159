//! Go-style durations (`8h`, `1h30m`, `90s`, `1.5h`), the format Kubernetes users write.

use std::str::FromStr;

use k8s_openapi::jiff::SignedDuration;

/// A Go duration as a flag or field value: `"1m30s".parse::<GoDuration>()`. Never negative
/// (the parser refuses a sign), so it converts to a `std::time::Duration` without loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoDuration(SignedDuration);

impl GoDuration {
    pub const ZERO: Self = Self(SignedDuration::ZERO);

    pub fn signed(self) -> SignedDuration {
        self.0
    }

    pub fn std(self) -> std::time::Duration {
        self.0.unsigned_abs()
    }

    pub fn is_zero(self) -> bool {
        self.0.is_zero()
    }
}

impl FromStr for GoDuration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        parse_go_duration(s).map(Self)
    }
}

impl From<std::time::Duration> for GoDuration {
    /// Saturates at the largest duration (about 292 years).
    fn from(d: std::time::Duration) -> Self {
        Self(SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX))
    }
}

/// Parses a Go `time.Duration` string. Negative durations are refused: every duration in
/// this API is a limit.
pub fn parse_go_duration(s: &str) -> Result<SignedDuration, String> {
    let bad = || format!("invalid duration {s:?}: use a Go duration such as \"8h\" or \"1h30m\"");
    if s.is_empty() {
        return Err(bad());
    }
    if s == "0" {
        return Ok(SignedDuration::ZERO);
    }
    let mut rest = s;
    let mut total_nanos: i128 = 0;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if num_end == 0 {
            return Err(bad());
        }
        let (num, tail) = rest.split_at(num_end);
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let unit_nanos: i128 = match unit {
            "ns" => 1,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(bad()),
        };
        let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
        if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
            return Err(bad());
        }
        let int: i128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| bad())?
        };
        total_nanos += int.checked_mul(unit_nanos).ok_or_else(bad)?;
        if !frac_part.is_empty() {
            let digits = frac_part.len().min(18) as u32;
            let frac: i128 = frac_part[..digits as usize].parse().map_err(|_| bad())?;
            total_nanos += frac * unit_nanos / 10i128.pow(digits);
        }
        if total_nanos > i64::MAX as i128 {
            return Err(bad());
        }
        rest = tail;
    }
    let secs = (total_nanos / 1_000_000_000) as i64;
    let nanos = (total_nanos % 1_000_000_000) as i32;
    Ok(SignedDuration::new(secs, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(
            parse_go_duration("8h").unwrap(),
            SignedDuration::from_hours(8)
        );
        assert_eq!(
            parse_go_duration("1h30m").unwrap(),
            SignedDuration::from_mins(90)
        );
        assert_eq!(
            parse_go_duration("1.5h").unwrap(),
            SignedDuration::from_mins(90)
        );
        assert_eq!(
            parse_go_duration("250ms").unwrap(),
            SignedDuration::from_millis(250)
        );
        assert_eq!(parse_go_duration("0").unwrap(), SignedDuration::ZERO);
        for bad in ["", "h", "8", "8d", "-1h", "1..5h", "1h-", " 8h"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn go_duration_parses_what_kube_flags_take() {
        let std = |s: &str| s.parse::<GoDuration>().unwrap().std();
        assert_eq!(std("10s"), std::time::Duration::from_secs(10));
        assert_eq!(std("1m30s"), std::time::Duration::from_secs(90));
        assert_eq!(std("1h"), std::time::Duration::from_secs(3600));
        assert_eq!(std("500ms"), std::time::Duration::from_millis(500));
        assert!("0".parse::<GoDuration>().unwrap().is_zero());
        assert_eq!(
            "1h30m".parse::<GoDuration>().unwrap().signed(),
            SignedDuration::from_mins(90)
        );
        let err = "ten seconds".parse::<GoDuration>().unwrap_err();
        assert!(err.contains("invalid duration"), "{err}");
        assert!("-5s".parse::<GoDuration>().is_err());
    }
}
