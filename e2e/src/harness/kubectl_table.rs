//! Reading `kubectl get` tables, whose cells may be blank.

use std::collections::BTreeMap;

/// The rows of a `kubectl get` table, each a map from column header to cell, cut at the
/// headers' positions (cells may be blank, so splitting on whitespace would misalign them).
pub fn parse_table(text: &str) -> Vec<BTreeMap<String, String>> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let mut starts: Vec<(usize, &str)> = Vec::new();
    let mut offset = 0;
    for word in header.split_whitespace() {
        let at = header[offset..].find(word).map_or(offset, |i| offset + i);
        starts.push((at, word));
        offset = at + word.len();
    }
    lines
        .map(|line| {
            starts
                .iter()
                .enumerate()
                .map(|(i, &(start, name))| {
                    let end = starts
                        .get(i + 1)
                        .map_or(line.len(), |&(next, _)| next.min(line.len()));
                    let cell = line
                        .get(start.min(line.len())..end)
                        .unwrap_or_default()
                        .trim();
                    (name.to_owned(), cell.to_owned())
                })
                .collect()
        })
        .collect()
}
