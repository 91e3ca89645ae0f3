//! The status page (`/`, HTML, no external assets, refreshes every 5 s) and its data (`/status`,
//! JSON): readiness and its reasons, the owned partitions with their lag and head-of-line age, and
//! the pipeline's counters that an operator looks at first.

use super::Telemetry;
use serde_json::{Value, json};
use std::fmt::Write as _;

impl Telemetry {
    /// `/status`: what the page shows, as JSON.
    pub(crate) fn status(&self) -> Value {
        let s = self.stats.snapshot();
        let reasons = self.not_ready();
        json!({
            "pipeline": self.name,
            "group": self.metrics.group,
            "ready": reasons.is_empty(),
            "reasons": reasons,
            "partitions": self.partition_status(),
            "counters": {
                "processed": s.processed,
                "dead_lettered": s.dead_lettered,
                "failed": s.failed,
                "retries": s.retries,
                "dedup_hits": s.dedup_hits,
                "in_flight": s.in_flight,
                "running": s.running,
                "transactions_committed": s.transactions_committed,
                "transactions_aborted": s.transactions_aborted,
                "commit_failures": s.commit_failures,
            },
            "breaker_open": s.breaker_open,
            "cluster_reachable": !s.cluster_unreachable,
        })
    }

    /// `/`: the status page.
    pub(crate) fn status_page(&self) -> String {
        let status = self.status();
        let mut html = String::with_capacity(4096);
        let ready = status["ready"].as_bool().unwrap_or(false);
        let _ = write!(
            html,
            "<!doctype html><html><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"5\">\
             <title>{name}: Millrace</title><style>\
             body{{font:14px sans-serif;margin:2em}}table{{border-collapse:collapse}}\
             td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}th{{background:#eee}}\
             .ready{{color:#060}}.not-ready{{color:#b00}}.stuck{{background:#fdd}}</style></head><body>\
             <h1>{name}</h1><p>group <code>{group}</code></p>",
            name = escape(&self.name),
            group = escape(&self.metrics.group),
        );
        if ready {
            html.push_str("<p id=\"readiness\" class=\"ready\">ready</p>");
        } else {
            html.push_str("<p id=\"readiness\" class=\"not-ready\">not ready:</p><ul id=\"reasons\">");
            for r in status["reasons"].as_array().into_iter().flatten() {
                let _ = write!(html, "<li>{}</li>", escape(r.as_str().unwrap_or_default()));
            }
            html.push_str("</ul>");
        }
        html.push_str(
            "<h2>Partitions</h2><table id=\"partitions\"><tr><th>topic</th><th>partition</th><th>end</th>\
             <th>committed</th><th>lag</th><th>in flight</th><th>head of line</th><th>held for (s)</th>\
             <th>blocker (key, failed attempts, last error)</th></tr>",
        );
        for p in status["partitions"].as_array().into_iter().flatten() {
            let (end, committed) = (p["end"].as_i64(), p["committed"].as_i64());
            let lag = end.zip(committed).map(|(e, c)| (e - c).max(0).to_string()).unwrap_or_default();
            let age = p["head_of_line_age_s"].as_f64().unwrap_or(0.0);
            let in_flight = p["in_flight"].as_u64().unwrap_or(0);
            let stuck = in_flight > 0 && age >= 60.0;
            let _ = write!(
                html,
                "<tr data-partition=\"{topic}/{partition}\"{class}><td>{topic}</td><td>{partition}</td><td>{end}</td>\
                 <td>{committed}</td><td class=\"lag\">{lag}</td><td>{in_flight}</td><td>{head}</td><td>{age:.1}</td><td class=\"blocker\">{blocker}</td></tr>",
                topic = escape(p["topic"].as_str().unwrap_or_default()),
                partition = p["partition"],
                class = if stuck { " class=\"stuck\"" } else { "" },
                end = end.map(|e| e.to_string()).unwrap_or_default(),
                committed = committed.map(|c| c.to_string()).unwrap_or_default(),
                head = if in_flight > 0 { p["completed"].to_string() } else { String::new() },
                blocker = blocker(&p["blocker"]),
            );
        }
        html.push_str("</table><h2>Counters</h2><table id=\"counters\">");
        for (k, v) in status["counters"].as_object().into_iter().flatten() {
            let _ = write!(html, "<tr><th>{}</th><td>{v}</td></tr>", escape(k));
        }
        let _ = write!(
            html,
            "<tr><th>breaker open</th><td>{}</td></tr><tr><th>cluster reachable</th><td>{}</td></tr></table>\
             <p><a href=\"/metrics\">metrics</a> · <a href=\"/status\">status (JSON)</a> · \
             <a href=\"/health/ready\">readiness</a></p></body></html>",
            status["breaker_open"], status["cluster_reachable"]
        );
        html
    }
}

/// A retrying head-of-line record: `key · N failed · error`.
fn blocker(b: &Value) -> String {
    if b.is_null() {
        return String::new();
    }
    escape(&format!(
        "{} · {} failed · {}",
        b["key"].as_str().unwrap_or("(no key)"),
        b["failed_attempts"],
        b["last_error"].as_str().unwrap_or_default()
    ))
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_page_escapes_names_and_says_why_it_is_not_ready() {
        let t = Telemetry::new("<b>billing</b>", "g", Duration::ZERO);
        let page = t.status_page();
        assert!(page.contains("&lt;b&gt;billing&lt;/b&gt;") && !page.contains("<b>billing"), "{page}");
        assert!(page.contains("not joined to the consumer group yet"), "{page}");
        assert_eq!(t.status()["ready"], false);
    }
}
