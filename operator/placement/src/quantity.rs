//! Kubernetes quantities rounded up to whole units or millis, as kube-scheduler counts them
//! (`Quantity.MilliValue()` for CPU, `Value()` for the rest, both rounding up).

/// Parses a quantity and returns `ceil(value * 10^scale)`, or `None` when it is malformed,
/// negative or too large.
pub(crate) fn ceil_scaled(text: &str, scale: i32) -> Option<u64> {
    let text = text.trim();
    let end = text
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || c == '.' || (i == 0 && c == '+')))
        .map_or(text.len(), |(i, _)| i);
    let (number, suffix) = text.split_at(end);
    let number = number.strip_prefix('+').unwrap_or(number);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let (exp10, exp2): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        e => (e.strip_prefix(['e', 'E'])?.parse::<i32>().ok()?, 0),
    };
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 30 || exp10.abs() > 40 {
        return None;
    }
    let mut value: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    value = value.checked_mul(1i128.checked_shl(exp2)?)?;
    let mut exp = exp10 + scale - frac.len() as i32;
    while exp > 0 {
        value = value.checked_mul(10)?;
        exp -= 1;
    }
    if exp < 0 {
        let divisor = 10i128.checked_pow(exp.unsigned_abs())?;
        value = (value + divisor - 1) / divisor;
    }
    u64::try_from(value).ok()
}

#[cfg(test)]
mod tests {
    use super::ceil_scaled;

    #[test]
    fn cpu_in_millis_rounds_up() {
        assert_eq!(ceil_scaled("500m", 3), Some(500));
        assert_eq!(ceil_scaled("2", 3), Some(2000));
        assert_eq!(ceil_scaled("0.1", 3), Some(100));
        assert_eq!(ceil_scaled("1.0005", 3), Some(1001));
        assert_eq!(ceil_scaled("100u", 3), Some(1));
    }

    #[test]
    fn bytes_and_units() {
        assert_eq!(ceil_scaled("1Gi", 0), Some(1 << 30));
        assert_eq!(ceil_scaled("1.5Gi", 0), Some(3 << 29));
        assert_eq!(ceil_scaled("128M", 0), Some(128_000_000));
        assert_eq!(ceil_scaled("1e3", 0), Some(1000));
        assert_eq!(ceil_scaled("110", 0), Some(110));
        assert_eq!(ceil_scaled("100m", 0), Some(1));
    }

    #[test]
    fn garbage_and_negatives_are_refused() {
        for text in ["", "abc", "-1", "1x", "1.2.3", "1e", "1Zi"] {
            assert_eq!(ceil_scaled(text, 0), None, "{text:?}");
        }
    }
}
