//! kubectl-style tables: upper-case headers, columns left-aligned and three spaces apart.

/// Renders `rows` under `headers`; a row shorter than the headers is padded with blanks.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            text.push_str(cell);
            if i < last {
                text.extend(std::iter::repeat_n(' ', width - cell.chars().count() + 3));
            }
        }
        text.trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(
            (0..headers.len())
                .map(|i| row.get(i).map_or("", String::as_str))
                .collect(),
        ));
    }
    out
}

/// `-` for nothing, else the items joined by commas.
pub fn list(items: &[String]) -> String {
    if items.is_empty() {
        "-".into()
    } else {
        items.join(",")
    }
}

/// `-` for `None`, else the value.
pub fn or_dash(value: Option<impl ToString>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_like_kubectls() {
        let text = render(
            &["NODE", "CARD", "MODE"],
            &[
                vec!["gpu-node-1".into(), "0".into(), "TDM".into()],
                vec!["n2".into(), "12".into()],
            ],
        );
        assert_eq!(
            text,
            "NODE         CARD   MODE\ngpu-node-1   0      TDM\nn2           12\n"
        );
        assert_eq!(list(&[]), "-");
        assert_eq!(or_dash(Some(3)), "3");
        assert_eq!(or_dash(None::<u32>), "-");
    }
}
