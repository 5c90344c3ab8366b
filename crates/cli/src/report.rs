//! Report helpers shared by the commands: latency histograms and plain-text tables.

use hdrhistogram::Histogram;
use indicatif::{HumanCount, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// What a progress bar counts.
pub enum Progress {
    /// Items (blocks, cycles, bytes): position / length and an ETA.
    Count,
    /// Time: the length is in milliseconds; shows the elapsed time.
    Time,
}

/// A progress bar on stderr (indicatif hides it when stderr is not a terminal); `quiet`
/// (--json) hides it always.
pub fn progress_bar(prefix: &str, length: u64, kind: Progress, quiet: bool) -> ProgressBar {
    let pb = ProgressBar::new(length);
    if quiet {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    let template = match kind {
        Progress::Count => "{prefix:>14} [{bar:30}] {pos}/{len} {eta}",
        Progress::Time => "{prefix:>28} [{bar:30}] {elapsed}",
    };
    pb.set_style(ProgressStyle::with_template(template).expect("valid template").progress_chars("=> "));
    pb.set_prefix(prefix.to_string());
    pb
}

/// A progress bar that counts items, its length set later.
pub fn progress(what: &str, quiet: bool) -> ProgressBar {
    progress_bar(what, 0, Progress::Count, quiet)
}

/// Latencies in nanoseconds, from 1 ns to 1 hour, 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

/// The value at `quantile` (0..=1) in microseconds.
pub fn quantile_us(h: &Histogram<u64>, quantile: f64) -> f64 {
    h.value_at_quantile(quantile) as f64 / 1_000.0
}

/// Rounds to one decimal for JSON output (humans and diff tools both prefer it).
pub fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// A rate rounded to a whole number with thousands separators (indicatif's `HumanCount`):
/// 21200.4 -> "21,200".
pub fn thousands(x: f64) -> String {
    HumanCount(x.round() as u64).to_string()
}

/// A plain-text table with right-aligned numeric columns (every column but the first).
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Table { header: header.iter().map(|s| s.to_string()).collect(), rows: Vec::new() }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(cells.len(), self.header.len());
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| {
                std::iter::once(&self.header[c])
                    .chain(self.rows.iter().map(|r| &r[c]))
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| {
            let mut out = String::new();
            for (c, cell) in cells.iter().enumerate() {
                let pad = widths[c] - cell.chars().count();
                if c == 0 {
                    out.push_str(cell);
                    out.push_str(&" ".repeat(pad));
                } else {
                    out.push_str("  ");
                    out.push_str(&" ".repeat(pad));
                    out.push_str(cell);
                }
            }
            out.trim_end().to_string()
        };
        let mut out = line(&self.header);
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(21200.4), "21,200");
        assert_eq!(thousands(1234567.0), "1,234,567");
    }

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new(&["target", "rate"]);
        t.row(vec!["a".into(), "1".into()]);
        t.row(vec!["long-name".into(), "1,000".into()]);
        assert_eq!(t.render(), "target      rate\na              1\nlong-name  1,000\n");
    }
}
