//! `temper report RUN_DIR`: the run's curves as PNG files and one self-contained HTML page
//! (inline SVG), drawn from `metrics.jsonl`. Text uses an embedded DejaVu Sans, so no system
//! fonts are needed.
use crate::rundir::{read_metrics, write_atomic};
use anyhow::{bail, Context, Result};
use plotters::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One panel: a title, the metrics drawn on it, and against what.
pub struct Panel {
    pub file: &'static str,
    pub title: &'static str,
    pub keys: &'static [&'static str],
    pub x: Axis,
}

/// A panel's horizontal axis.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    Step,
    /// Minutes of the run's own time at the end of each step: the steps' `timing_s/step` and
    /// evaluations' `timing_s/eval` summed (what compares a synchronous run with an overlapped
    /// one: the same curve reached sooner).
    Minutes,
}

/// The panels of a report, in page order.
pub const PANELS: &[Panel] = &[
    Panel {
        file: "reward",
        title: "Reward (training batch)",
        keys: &["critic/score/mean", "critic/rewards/mean"],
        x: Axis::Step,
    },
    Panel {
        file: "accuracy",
        title: "Held-out accuracy",
        keys: &["val/accuracy", "val/pass@1"],
        x: Axis::Step,
    },
    Panel {
        file: "kl",
        title: "KL",
        keys: &["actor/ppo_kl", "actor/kl_loss", "rollout_corr/kl"],
        x: Axis::Step,
    },
    Panel {
        file: "entropy",
        title: "Entropy",
        keys: &["actor/entropy"],
        x: Axis::Step,
    },
    Panel {
        file: "length",
        title: "Response length (tokens)",
        keys: &["response_length/mean", "response_length/max"],
        x: Axis::Step,
    },
    Panel {
        file: "clip_ratio",
        title: "Responses cut at max length",
        keys: &["response_length/clip_ratio"],
        x: Axis::Step,
    },
    Panel {
        file: "loss",
        title: "Policy loss",
        keys: &["actor/pg_loss"],
        x: Axis::Step,
    },
    Panel {
        file: "grad_norm",
        title: "Grad norm (pre-clip)",
        keys: &["actor/grad_norm"],
        x: Axis::Step,
    },
    Panel {
        file: "zero_adv",
        title: "Zero-advantage groups",
        keys: &["batch/zero_adv_groups_frac"],
        x: Axis::Step,
    },
    Panel {
        file: "time",
        title: "Seconds per step",
        keys: &["timing_s/step", "timing_s/gen", "timing_s/update"],
        x: Axis::Step,
    },
    Panel {
        file: "reward_by_time",
        title: "Reward by wall-clock time",
        keys: &["critic/score/mean"],
        x: Axis::Minutes,
    },
    Panel {
        file: "accuracy_by_time",
        title: "Held-out accuracy by wall-clock time",
        keys: &["val/accuracy"],
        x: Axis::Minutes,
    },
];

/// Per step, the minutes of the run's own time at its end ([`Axis::Minutes`]): a resumed run
/// counts the time of the steps it kept, not the time it was stopped.
pub fn minutes_by_step(lines: &[BTreeMap<String, Value>]) -> BTreeMap<u64, f64> {
    let mut out = BTreeMap::new();
    let mut seconds = 0.0;
    for l in lines {
        let Some(step) = l.get("step").and_then(Value::as_u64) else {
            continue;
        };
        for key in ["timing_s/step", "timing_s/eval"] {
            if let Some(s) = l.get(key).and_then(Value::as_f64).filter(|s| s.is_finite()) {
                seconds += s;
            }
        }
        out.insert(step, seconds / 60.0);
    }
    out
}

/// (step, value) series of every numeric metric.
pub fn series(lines: &[BTreeMap<String, Value>]) -> BTreeMap<String, Vec<(f64, f64)>> {
    let mut out: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for l in lines {
        let Some(step) = l.get("step").and_then(Value::as_f64) else {
            continue;
        };
        for (k, v) in l {
            if let (false, Some(x)) = (k == "step", v.as_f64()) {
                if x.is_finite() {
                    out.entry(k.clone()).or_default().push((step, x));
                }
            }
        }
    }
    out
}

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
    });
}

const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

/// Draws one panel onto any plotters backend.
fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    x: Axis,
    lines: &[(&str, &[(f64, f64)])],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("drawing {title}: {e:?}");
    root.fill(&WHITE).map_err(err)?;
    let pts = lines.iter().flat_map(|(_, s)| s.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return Ok(());
    }
    let least = match x {
        Axis::Step => 1.0,
        Axis::Minutes => 1e-3,
    };
    if x1 - x0 < least {
        x1 = x0 + least;
    }
    let pad = ((y1 - y0).abs() * 0.08).max(1e-6);
    let (y0, y1) = (y0 - pad, y1 + pad);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(32)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(match x {
            Axis::Step => "step",
            Axis::Minutes => "minutes",
        })
        .x_label_formatter(&|v| match x {
            Axis::Step => format!("{}", v.round() as i64),
            Axis::Minutes => format!("{v:.1}"),
        })
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    for (i, (name, s)) in lines.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let style = ShapeStyle {
            color: c.to_rgba(),
            filled: true,
            stroke_width: 2,
        };
        chart
            .draw_series(LineSeries::new(s.iter().copied(), style))
            .map_err(err)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
        if s.len() <= 60 {
            chart
                .draw_series(s.iter().map(|&p| Circle::new(p, 2, c.filled())))
                .map_err(err)?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Writes `<out>/<panel>.png` for every panel with data and `<out>/index.html`; returns the page.
pub fn render_report(run_dir: &Path, out: Option<&Path>) -> Result<PathBuf> {
    register_font();
    let metrics_path = run_dir.join("metrics.jsonl");
    if !metrics_path.is_file() {
        bail!(
            "{}: no metrics.jsonl (is this a run folder?)",
            run_dir.display()
        );
    }
    let lines = read_metrics(&metrics_path)?;
    if lines.is_empty() {
        bail!("{}: no steps recorded yet", metrics_path.display());
    }
    let all = series(&lines);
    let minutes = minutes_by_step(&lines);
    // The same series against the run's time (a step without a time keeps its step's place).
    let timed: BTreeMap<String, Vec<(f64, f64)>> = all
        .iter()
        .map(|(k, s)| {
            let at = |step: f64| minutes.get(&(step as u64)).copied();
            (
                k.clone(),
                s.iter()
                    .filter_map(|&(step, v)| at(step).map(|m| (m, v)))
                    .collect(),
            )
        })
        .collect();
    let out = out
        .map(Path::to_path_buf)
        .unwrap_or_else(|| run_dir.join("report"));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let (w, h) = (720u32, 400u32);
    let mut sections = String::new();
    for p in PANELS {
        let source = match p.x {
            Axis::Step => &all,
            Axis::Minutes => &timed,
        };
        let data: Vec<(&str, &[(f64, f64)])> = p
            .keys
            .iter()
            .filter_map(|k| {
                source
                    .get(*k)
                    .filter(|s| !s.is_empty())
                    .map(|s| (*k, s.as_slice()))
            })
            .collect();
        if data.is_empty() {
            continue;
        }
        let png = out.join(format!("{}.png", p.file));
        temper_base::atomic_file::write_atomic_with(&png, |tmp| {
            draw(
                BitMapBackend::new(tmp, (w, h)).into_drawing_area(),
                p.title,
                p.x,
                &data,
            )
        })?;
        let mut svg = String::new();
        draw(
            SVGBackend::with_string(&mut svg, (w, h)).into_drawing_area(),
            p.title,
            p.x,
            &data,
        )?;
        let last: Vec<String> = data
            .iter()
            .map(|(k, s)| {
                let (at, value) = s.last().copied().unwrap_or((0.0, f64::NAN));
                match p.x {
                    Axis::Step => format!("{k} = {value:.4} (step {at})"),
                    Axis::Minutes => format!("{k} = {value:.4} (after {at:.1} min)"),
                }
            })
            .collect();
        sections.push_str(&format!(
            "<section><div class=\"plot\">{svg}</div><p>{}</p></section>\n",
            html_escape(&last.join("; "))
        ));
    }
    let config = std::fs::read_to_string(run_dir.join("config.toml")).unwrap_or_default();
    let meta = std::fs::read_to_string(run_dir.join("run_metadata.json")).unwrap_or_default();
    let title = run_dir.file_name().map_or_else(
        || run_dir.display().to_string(),
        |n| n.to_string_lossy().to_string(),
    );
    let page = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>temper run {t}</title><style>\
         body{{font-family:sans-serif;margin:2em;max-width:1560px}} section{{display:inline-block;margin:0 1em 1em 0;vertical-align:top}} \
         .plot svg{{width:720px;height:400px}} p{{font-size:13px;color:#333;max-width:720px}} pre{{background:#f6f6f6;padding:1em;overflow:auto}}\
         </style></head><body><h1>temper run {t}</h1><p>{n} metric lines, last step {last}.</p>\n{sections}\
         <h2>Config</h2><pre>{cfg}</pre><h2>Metadata</h2><pre>{meta}</pre></body></html>\n",
        t = html_escape(&title),
        n = lines.len(),
        last = lines.last().and_then(|l| l.get("step")).map_or_else(String::new, |v| v.to_string()),
        cfg = html_escape(&config),
        meta = html_escape(&meta),
    );
    let index = out.join("index.html");
    write_atomic(&index, page.as_bytes())?;
    Ok(index)
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
