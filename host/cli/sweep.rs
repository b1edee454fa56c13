//! The scaling view: µs per request and TB/s across batch sizes and context lengths, ours and
//! FlashInfer's, from bench results on a batch × length grid (`benches/sweep-shapes.json`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::bench::{BenchRow, Shape};

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// One FlashInfer result row (the anchor harness's JSON): its better path's time and the bytes
/// it counts, which are ours too; a row whose data could not be made has neither.
#[derive(Debug, Clone, Deserialize)]
struct AnchorRow {
    name: String,
    best_us: Option<f64>,
    #[serde(default)]
    bytes: Option<f64>,
}

/// One grid point: batch, length, and each side's µs per call and TB/s.
#[derive(Debug, Clone, Copy, Default)]
struct Point {
    ours_us: Option<f64>,
    ours_tb_s: Option<f64>,
    anchor_us: Option<f64>,
    anchor_tb_s: Option<f64>,
}

/// `(length, batch) → point`, from the grid's shapes and the two result files.
fn grid(shapes: &[Shape], ours: &[BenchRow], anchor: &[AnchorRow]) -> BTreeMap<(usize, usize), Point> {
    let mut points = BTreeMap::new();
    for s in shapes {
        // A point needs a length and at least one request (µs per request).
        let Some(len) = s.kv_len.filter(|_| s.batch() > 0) else { continue };
        let mut p = Point::default();
        if let Some(r) = ours.iter().find(|r| r.name == s.name) {
            p.ours_us = Some(r.us);
            p.ours_tb_s = Some(r.tb_s);
        }
        if let Some(r) = anchor.iter().find(|r| r.name == s.name) {
            p.anchor_us = r.best_us;
            p.anchor_tb_s = r.best_us.zip(r.bytes).map(|(us, bytes)| bytes / (us * 1e-6) / 1e12);
        }
        points.insert((len, s.batch()), p);
    }
    points
}

/// Reads the grid and the results, prints the table (µs per request, TB/s, speedup) and draws
/// the two log–log panels into `out`.
pub fn plot_sweep(
    shapes: &Path,
    ours: &Path,
    anchor: Option<&Path>,
    out: &Path,
    ceiling: Option<f64>,
) -> AnyResult<()> {
    let shapes: Vec<Shape> = serde_json::from_str(&std::fs::read_to_string(shapes)?)?;
    let ours: Vec<BenchRow> = serde_json::from_str(&std::fs::read_to_string(ours)?)?;
    let anchor: Vec<AnchorRow> = match anchor {
        Some(path) => serde_json::from_str(&std::fs::read_to_string(path)?)?,
        None => Vec::new(),
    };
    let ceiling = ceiling.unwrap_or_else(|| crate::bench::ceiling_of(&ours));
    let points = grid(&shapes, &ours, &anchor);
    print_table(&points);
    draw(&points, out, ceiling)
}

fn print_table(points: &BTreeMap<(usize, usize), Point>) {
    println!(
        "{:>6} {:>6} {:>12} {:>12} {:>10} {:>10} {:>8}",
        "L", "batch", "ours µs/req", "FI µs/req", "ours TB/s", "FI TB/s", "speedup"
    );
    let fmt = |v: Option<f64>, digits: usize| v.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"));
    for (&(len, batch), p) in points {
        let per = |us: Option<f64>| us.map(|us| us / batch as f64);
        let speedup = p.ours_us.zip(p.anchor_us).map(|(o, a)| a / o);
        println!(
            "{len:>6} {batch:>6} {:>12} {:>12} {:>10} {:>10} {:>8}",
            fmt(per(p.ours_us), 4),
            fmt(per(p.anchor_us), 4),
            fmt(p.ours_tb_s, 2),
            fmt(p.anchor_tb_s, 2),
            fmt(speedup, 2)
        );
    }
}

fn draw(points: &BTreeMap<(usize, usize), Point>, out: &Path, ceiling: f64) -> AnyResult<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(out, (1400, 620)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(700);
    let lengths: Vec<usize> =
        points.keys().map(|k| k.0).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let max_batch = points.keys().map(|k| k.1).max().unwrap_or(1).max(2) as f64;
    let per_request: Vec<f64> = points
        .iter()
        .flat_map(|(&(_, b), p)| [p.ours_us, p.anchor_us].into_iter().flatten().map(move |us| us / b as f64))
        .collect();
    let lo = per_request.iter().copied().fold(f64::INFINITY, f64::min).max(1e-4) / 1.5;
    let hi = per_request.iter().copied().fold(0.0, f64::max).max(lo * 10.0) * 1.5;
    // Room above the ceiling, and above any point past it (rows whose bytes sit in L2).
    let fastest = points.values().flat_map(|p| [p.ours_tb_s, p.anchor_tb_s]).flatten().fold(0.0, f64::max);
    let top = ceiling.max(1.0).max(fastest) * 1.1;
    if let Some(bad) = [lo, hi, top].into_iter().find(|v| !v.is_finite()) {
        return Err(format!("cannot plot an axis bound of {bad} (µs per request or TB/s)").into());
    }
    let series = |len: usize, pick: fn(&Point) -> Option<f64>, per_req: bool| -> Vec<(f64, f64)> {
        points
            .range((len, 0)..=(len, usize::MAX))
            .filter_map(|(&(_, b), p)| pick(p).map(|v| (b as f64, if per_req { v / b as f64 } else { v })))
            .collect()
    };
    let color = |i: usize| Palette99::pick(i).to_rgba();

    let mut chart = ChartBuilder::on(&left)
        .caption("µs per request (log–log; solid: ours, thin + circles: FlashInfer)", ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((1f64..max_batch * 1.2).log_scale(), (lo..hi).log_scale())?;
    chart.configure_mesh().x_desc("batch").y_desc("µs per request").draw()?;
    for (i, &len) in lengths.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(LineSeries::new(series(len, |p| p.ours_us, true), c.stroke_width(3)))?
            .label(format!("L = {len}"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(3)));
        chart.draw_series(LineSeries::new(series(len, |p| p.anchor_us, true), c.stroke_width(1)))?;
        chart.draw_series(series(len, |p| p.anchor_us, true).into_iter().map(|xy| Circle::new(xy, 3, c)))?;
    }
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.8)).draw()?;

    let mut chart = ChartBuilder::on(&right)
        .caption("TB/s against the read ceiling", ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((1f64..max_batch * 1.2).log_scale(), 0f64..top)?;
    chart.configure_mesh().x_desc("batch").y_desc("TB/s").draw()?;
    for (i, &len) in lengths.iter().enumerate() {
        let c = color(i);
        chart.draw_series(LineSeries::new(series(len, |p| p.ours_tb_s, false), c.stroke_width(3)))?;
        chart.draw_series(LineSeries::new(series(len, |p| p.anchor_tb_s, false), c.stroke_width(1)))?;
        chart
            .draw_series(series(len, |p| p.anchor_tb_s, false).into_iter().map(|xy| Circle::new(xy, 3, c)))?;
    }
    chart
        .draw_series(LineSeries::new([(1.0, ceiling), (max_batch * 1.2, ceiling)], RED.stroke_width(2)))?
        .label(format!("read ceiling {ceiling:.2} TB/s"))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED));
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.8)).draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_plot_reads_both_result_files() {
        let dir = std::env::temp_dir().join(format!("paged-decode-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let shape = |b: usize, l: usize| {
            serde_json::json!({"name": format!("sw-b{b}-L{l}"), "batch": b, "kv_len": l, "hq": 32, "hkv": 8,
                               "d": 128, "page": 16, "dtype": "f16"})
        };
        let ours = |b: usize, l: usize, us: f64| {
            serde_json::json!({"name": format!("sw-b{b}-L{l}"), "us": us, "tb_s": 2.0, "pct_of_ceiling": 50.0,
                               "num_splits": 1, "num_chunks": b})
        };
        let fi = |b: usize, l: usize, us: f64| serde_json::json!({"name": format!("sw-b{b}-L{l}"), "best_us": us, "bytes": 1e6});
        let files = [
            ("shapes.json", serde_json::json!([shape(1, 64), shape(16, 64), shape(16, 256)])),
            ("ours.json", serde_json::json!([ours(1, 64, 3.0), ours(16, 64, 5.0), ours(16, 256, 9.0)])),
            ("fi.json", serde_json::json!([fi(1, 64, 4.0), fi(16, 64, 6.0)])),
        ];
        for (name, v) in &files {
            std::fs::write(dir.join(name), v.to_string()).unwrap();
        }
        let svg = dir.join("sweep.svg");
        plot_sweep(&dir.join("shapes.json"), &dir.join("ours.json"), Some(&dir.join("fi.json")), &svg, None)
            .unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("read ceiling 4.00 TB/s") && text.contains("L = 256"), "{text}");
        let shapes: Vec<Shape> = serde_json::from_value(files[0].1.clone()).unwrap();
        let ours: Vec<BenchRow> = serde_json::from_value(files[1].1.clone()).unwrap();
        let fi: Vec<AnchorRow> = serde_json::from_value(files[2].1.clone()).unwrap();
        let g = grid(&shapes, &ours, &fi);
        assert_eq!(g.len(), 3);
        assert_eq!(g[&(64, 16)].anchor_us, Some(6.0));
        assert_eq!(g[&(256, 16)].anchor_us, None);
    }

    /// Rows without requests, lengths at `usize::MAX`, times or ceilings whose axes would be
    /// infinite: an error or a plot, never a panic or an endless draw.
    #[test]
    fn sweep_plot_takes_malformed_rows() {
        let dir = std::env::temp_dir().join(format!("paged-decode-sweep-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (shapes, ours, svg) = (dir.join("shapes.json"), dir.join("ours.json"), dir.join("sweep.svg"));
        let shape = |name: &str, batch: Option<usize>, len: usize| {
            serde_json::json!({"name": name, "batch": batch, "kv_len": len, "hq": 32, "hkv": 8, "d": 128,
                               "page": 16, "dtype": "f16"})
        };
        let ours_row = |name: &str, us: f64| {
            serde_json::json!({"name": name, "us": us, "tb_s": 2.0, "pct_of_ceiling": 50.0, "num_splits": 1,
                               "num_chunks": 1})
        };
        let cases = [
            (shape("none", None, 64), ours_row("none", 3.0), None),
            (shape("zero", Some(0), 64), ours_row("zero", 3.0), None),
            (shape("long", Some(4), usize::MAX), ours_row("long", 3.0), None),
            (shape("slow", Some(4), 64), ours_row("slow", f64::MAX), None),
            (shape("inf", Some(4), 64), ours_row("inf", 3.0), Some(f64::INFINITY)),
        ];
        for (s, o, ceiling) in cases {
            std::fs::write(&shapes, serde_json::json!([s]).to_string()).unwrap();
            std::fs::write(&ours, serde_json::json!([o]).to_string()).unwrap();
            let _ = plot_sweep(&shapes, &ours, None, &svg, ceiling);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
