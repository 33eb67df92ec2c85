//! Number and machine formatting for the benches' markdown tables.

use std::time::Duration;

/// `1000000` → `1,000,000`.
pub fn fmt_n(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// `[1000, 5000]` → `1,000, 5,000`.
pub fn fmt_list(values: &[u64]) -> String {
    values
        .iter()
        .map(|v| fmt_n(*v))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `12345.6` → `12.3k`.
pub fn k(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.1}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

/// Milliseconds with a sensible precision.
pub fn ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1000.0;
    if v < 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// `a / b` as `0.93×`.
pub fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}×", a / b)
    } else {
        "–".into()
    }
}

/// Bytes as MiB.
pub fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

/// The median of `values` (NaN when there are none).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 0 => (values[mid - 1] + values[mid]) / 2.0,
        _ => values[mid],
    }
}

/// Per 100k events.
pub fn per_100k(v: f64, events: u64) -> f64 {
    v * 100_000.0 / events as f64
}

/// `nproc`, memory and CPU model.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "?".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or("?".into(), |kb| format!("{:.0} GiB", kb as f64 / 1048576.0));
    format!("{cores} cores ({cpu}), {mem} RAM")
}
