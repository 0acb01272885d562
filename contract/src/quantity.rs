//! Kubernetes quantities (`resource.Quantity`) reduced to whole numbers.
//!
//! Extended resources are counted in whole units, so every GPU resource value must be an
//! integer. The apiserver accepts any quantity syntax (`4`, `1k`, `2e3`, `1000m`), so this parses
//! the full grammar and refuses values that are not whole numbers.

use thiserror::Error;

/// Why a quantity is not a whole number this project can use.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QuantityError {
    /// The text is not a quantity at all.
    #[error("is not a quantity")]
    Malformed,
    /// The value has a fractional part.
    #[error("is not a whole number")]
    Fractional,
    /// The value does not fit in 64 bits.
    #[error("is too large")]
    TooLarge,
}

/// Parses a Kubernetes quantity that must be a whole number, such as `4`, `128`, `1k` or `2Ki`.
pub fn parse_whole(text: &str) -> Result<i64, QuantityError> {
    let text = text.trim();
    let (number, suffix) = split_suffix(text);
    let (negative, digits) = match number.as_bytes().first() {
        Some(b'-') => (true, &number[1..]),
        Some(b'+') => (false, &number[1..]),
        _ => (false, number),
    };
    let (int_part, frac_part) = digits.split_once('.').unwrap_or((digits, ""));
    if int_part.is_empty() && frac_part.is_empty()
        || !int_part
            .bytes()
            .chain(frac_part.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return Err(QuantityError::Malformed);
    }
    let scale = Scale::parse(suffix)?;

    // value = mantissa * 2^exp2 * 10^(exp10 - frac_digits), computed exactly.
    let frac_part = frac_part.trim_end_matches('0');
    let mantissa_digits = format!("{int_part}{frac_part}");
    let mantissa_digits = mantissa_digits.trim_start_matches('0');
    if mantissa_digits.len() > 36 {
        return Err(QuantityError::TooLarge);
    }
    let mut value: i128 = if mantissa_digits.is_empty() {
        0
    } else {
        mantissa_digits
            .parse()
            .map_err(|_| QuantityError::Malformed)?
    };
    value = value
        .checked_shl(scale.exp2)
        .filter(|v| v >> scale.exp2 == value)
        .ok_or(QuantityError::TooLarge)?;
    let mut exp10 = scale.exp10 - frac_part.len() as i32;
    while exp10 > 0 {
        value = value.checked_mul(10).ok_or(QuantityError::TooLarge)?;
        exp10 -= 1;
    }
    while exp10 < 0 {
        if value % 10 != 0 {
            return Err(QuantityError::Fractional);
        }
        value /= 10;
        exp10 += 1;
    }
    let value = if negative { -value } else { value };
    i64::try_from(value).map_err(|_| QuantityError::TooLarge)
}

/// Splits `text` into its number and its suffix (`Ki`, `k`, `m`, `e3`, ...).
fn split_suffix(text: &str) -> (&str, &str) {
    let end = text
        .char_indices()
        .skip(1) // a leading sign is part of the number
        .find(|&(_, c)| !(c.is_ascii_digit() || c == '.'))
        .map_or(text.len(), |(i, _)| i);
    text.split_at(end)
}

/// A quantity suffix as powers of ten and two.
struct Scale {
    exp10: i32,
    exp2: u32,
}

impl Scale {
    fn parse(suffix: &str) -> Result<Self, QuantityError> {
        let decimal = |exp10| Ok(Scale { exp10, exp2: 0 });
        let binary = |exp2| Ok(Scale { exp10: 0, exp2 });
        match suffix {
            "" => decimal(0),
            "n" => decimal(-9),
            "u" => decimal(-6),
            "m" => decimal(-3),
            "k" => decimal(3),
            "M" => decimal(6),
            "G" => decimal(9),
            "T" => decimal(12),
            "P" => decimal(15),
            "E" => decimal(18),
            "Ki" => binary(10),
            "Mi" => binary(20),
            "Gi" => binary(30),
            "Ti" => binary(40),
            "Pi" => binary(50),
            "Ei" => binary(60),
            exponent => {
                let digits = exponent
                    .strip_prefix(['e', 'E'])
                    .ok_or(QuantityError::Malformed)?;
                let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
                if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(QuantityError::Malformed);
                }
                let exp10: i32 = digits.parse().map_err(|_| QuantityError::TooLarge)?;
                if exp10.abs() > 40 {
                    return Err(QuantityError::TooLarge);
                }
                decimal(exp10)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_in_every_notation() {
        for (text, want) in [
            ("4", 4),
            ("0", 0),
            ("+7", 7),
            ("-3", -3),
            ("1k", 1000),
            ("2Ki", 2048),
            ("1Mi", 1 << 20),
            ("2e3", 2000),
            ("2E3", 2000),
            ("1000m", 1),
            ("1.0", 1),
            ("1.50k", 1500),
            ("0.5Ki", 512),
            ("120e-1", 12),
        ] {
            assert_eq!(parse_whole(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn fractions_are_refused() {
        for text in ["0.5", "500m", "1.5", "12e-1", "0.3Ki"] {
            assert_eq!(parse_whole(text), Err(QuantityError::Fractional), "{text}");
        }
    }

    #[test]
    fn garbage_is_malformed() {
        for text in [
            "", "abc", "4 GiB", "4gi", "1.2.3", ".", "e3", "1e", "1e+", "--1", "1x",
        ] {
            assert_eq!(parse_whole(text), Err(QuantityError::Malformed), "{text:?}");
        }
    }

    #[test]
    fn huge_values_are_too_large() {
        for text in ["10E", "99999999999999999999", "1e40", "16Ei"] {
            assert_eq!(parse_whole(text), Err(QuantityError::TooLarge), "{text}");
        }
    }
}
