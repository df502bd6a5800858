//! Small SVG drawing for the console: an element writer that escapes every
//! text, and the two chart shapes the overview needs (stacked columns over
//! time, horizontal bars per provider). No script, no library in the browser.

use std::fmt::Write;

/// Text escaped for SVG/HTML content and attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

pub struct Svg {
    out: String,
}

impl Svg {
    pub fn new(width: f64, height: f64, id: &str) -> Self {
        Svg {
            out: format!(
                "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"{}\" viewBox=\"0 0 {width:.0} {height:.0}\" width=\"100%\" style=\"max-width:{width:.0}px\" role=\"img\">",
                esc(id)
            ),
        }
    }

    /// Markup the caller has escaped itself.
    pub fn raw(&mut self, markup: &str) {
        self.out.push_str(markup);
    }

    #[expect(clippy::too_many_arguments, reason = "an SVG line is its attributes")]
    pub fn line(
        &mut self,
        x1: f64,
        y1: f64,
        x2: f64,
        y2: f64,
        stroke: &str,
        width: f64,
        dash: Option<&str>,
    ) {
        let dash = dash
            .map(|d| format!(" stroke-dasharray=\"{}\"", esc(d)))
            .unwrap_or_default();
        let _ = write!(
            self.out,
            "<line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" stroke=\"{}\" stroke-width=\"{width}\"{dash}/>",
            esc(stroke)
        );
    }

    pub fn text(&mut self, x: f64, y: f64, text: &str, anchor: &str, size: f64, fill: &str) {
        let _ = write!(
            self.out,
            "<text x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"{}\" font-size=\"{size}\" fill=\"{}\">{}</text>",
            esc(anchor),
            esc(fill),
            esc(text)
        );
    }

    pub fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str, title: &str) {
        let _ = write!(
            self.out,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{}</title></rect>",
            w.max(0.0),
            h.max(0.0),
            esc(fill),
            esc(title)
        );
    }

    pub fn finish(mut self) -> String {
        self.out.push_str("</svg>");
        self.out
    }
}

/// One named series and its colour.
pub struct Series<'a> {
    pub name: &'a str,
    pub colour: &'a str,
}

/// Width of `text` at font size 10 in a sans-serif face, erring wide (a
/// DejaVu Sans lower-case letter is about 6.1 px; `_` and `m`, `w` wider).
fn text_width(text: &str) -> f64 {
    text.chars()
        .map(|c| match c {
            'm' | 'w' | 'M' | 'W' | '_' => 9.0,
            'i' | 'l' | 'j' | 't' | 'f' | 'r' | ' ' | '.' => 4.0,
            _ => 6.5,
        })
        .sum()
}

const LEGEND_ROW: f64 = 14.0;

/// Draws the legend from `y` down, wrapping onto another row before an entry
/// would pass the right edge; how many rows it took.
fn legend(svg: &mut Svg, series: &[Series], y: f64, width: f64) -> usize {
    let (left, right) = (40.0, width - 6.0);
    let (mut x, mut row) = (left, 0);
    for s in series {
        let w = 13.0 + text_width(s.name);
        if x > left && x + w > right {
            row += 1;
            x = left;
        }
        let y = y + row as f64 * LEGEND_ROW;
        svg.rect(x, y - 9.0, 10.0, 10.0, s.colour, s.name);
        svg.text(x + 13.0, y, s.name, "start", 10.0, "#475467");
        x += w + 10.0;
    }
    row + 1
}

/// How many rows `legend` takes (drawn into a scratch image).
fn legend_rows(series: &[Series], width: f64) -> usize {
    legend(&mut Svg::new(width, 0.0, ""), series, 0.0, width)
}

/// Columns over time, each stacked by series: `columns[i].1[j]` is series
/// `j`'s value in column `i`; `columns[i].0` labels the column (every few
/// columns get their label drawn).
pub fn stacked_columns(id: &str, columns: &[(String, Vec<f64>)], series: &[Series]) -> String {
    let (width, left, bottom) = (420.0, 40.0, 36.0);
    let extra = (legend_rows(series, width) - 1) as f64 * LEGEND_ROW;
    let (height, top) = (210.0 + extra, 22.0 + extra);
    let mut svg = Svg::new(width, height, id);
    legend(&mut svg, series, 12.0, width);
    let max = columns
        .iter()
        .map(|(_, v)| v.iter().sum::<f64>())
        .fold(0.0, f64::max)
        .max(1.0);
    let plot_h = height - bottom - top;
    let plot_w = width - left - 10.0;
    svg.line(
        left,
        top + plot_h,
        left + plot_w,
        top + plot_h,
        "#98a2b3",
        1.0,
        None,
    );
    svg.text(
        left - 4.0,
        top + 8.0,
        &format_number(max),
        "end",
        10.0,
        "#667085",
    );
    svg.text(left - 4.0, top + plot_h, "0", "end", 10.0, "#667085");
    let n = columns.len().max(1) as f64;
    let col_w = plot_w / n;
    let label_every = (columns.len() / 6).max(1);
    for (i, (label, values)) in columns.iter().enumerate() {
        let x = left + i as f64 * col_w;
        let mut y = top + plot_h;
        for (j, v) in values.iter().enumerate() {
            let h = v / max * plot_h;
            if h > 0.0 {
                let s = &series[j.min(series.len().saturating_sub(1))];
                svg.rect(
                    x + col_w * 0.1,
                    y - h,
                    col_w * 0.8,
                    h,
                    s.colour,
                    &format!("{label}: {} {}", format_number(*v), s.name),
                );
            }
            y -= h;
        }
        if i % label_every == 0 {
            svg.text(
                x + col_w / 2.0,
                top + plot_h + 14.0,
                label,
                "middle",
                10.0,
                "#667085",
            );
        }
    }
    svg.finish()
}

/// Horizontal bars, one row per label, each stacked by series.
pub fn stacked_rows(
    id: &str,
    rows: &[(String, Vec<f64>)],
    series: &[Series],
    unit: &str,
) -> String {
    let row_h = 24.0;
    let (width, left) = (420.0, 110.0);
    let top = 26.0 + (legend_rows(series, width) - 1) as f64 * LEGEND_ROW;
    let height = top + rows.len().max(1) as f64 * row_h + 10.0;
    let mut svg = Svg::new(width, height, id);
    legend(&mut svg, series, 12.0, width);
    if rows.is_empty() {
        svg.text(
            left,
            top + 16.0,
            "nothing in this window",
            "start",
            11.0,
            "#667085",
        );
        return svg.finish();
    }
    let max = rows
        .iter()
        .map(|(_, v)| v.iter().sum::<f64>())
        .fold(0.0, f64::max)
        .max(1e-9);
    let plot_w = width - left - 70.0;
    for (i, (label, values)) in rows.iter().enumerate() {
        let y = top + i as f64 * row_h;
        svg.text(left - 6.0, y + 15.0, label, "end", 11.0, "#1d2330");
        let mut x = left;
        for (j, v) in values.iter().enumerate() {
            let w = v / max * plot_w;
            if w > 0.0 {
                let s = &series[j.min(series.len().saturating_sub(1))];
                svg.rect(
                    x,
                    y + 4.0,
                    w,
                    14.0,
                    s.colour,
                    &format!("{label}: {} {unit} {}", format_number(*v), s.name),
                );
            }
            x += w;
        }
        let total: f64 = values.iter().sum();
        svg.text(
            x + 4.0,
            y + 15.0,
            &format!("{} {unit}", format_number(total)),
            "start",
            10.0,
            "#475467",
        );
    }
    svg.finish()
}

pub fn format_number(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_legend_wraps_before_its_last_entry_would_pass_the_edge() {
        let names = [
            "succeeded",
            "failed",
            "needs_review",
            "cancelled",
            "in flight",
            "discarded",
        ];
        let series: Vec<Series> = names
            .iter()
            .map(|n| Series {
                name: n,
                colour: "#000",
            })
            .collect();
        let mut svg = Svg::new(420.0, 100.0, "t");
        let rows = legend(&mut svg, &series, 12.0, 420.0);
        assert_eq!(rows, 2);
        let out = svg.finish();
        // Every label starts inside and, at its estimated width, ends inside.
        for part in out.split("<text x=\"").skip(1) {
            let x: f64 = part.split('"').next().unwrap().parse().unwrap();
            let name = part.split('>').nth(1).unwrap().split('<').next().unwrap();
            assert!(x + text_width(name) <= 414.0, "{name} at {x}");
        }
    }

    #[test]
    fn text_is_escaped() {
        let mut svg = Svg::new(10.0, 10.0, "t");
        svg.text(0.0, 0.0, "<script>&\"", "start", 10.0, "#000");
        let out = svg.finish();
        assert!(out.contains("&lt;script&gt;&amp;&quot;"), "{out}");
        assert!(!out.contains("<script>"));
    }
}
