//! Progress of long work on the terminal: a batch run's reads and an available-now
//! backfill's micro-batches, as a bar redrawn in place on a terminal and as plain lines
//! otherwise (a log file, CI).
//!
//! The figures come from two places: the sources' [`ReadProgress`] (files and bytes of
//! the read going on, polled), and, after each micro-batch, its progress record (what it
//! read, and the sources' backlog: what is still to read). Files done of the total is
//! then `files read so far / (files read so far + files in the backlog)`.

use etlantic_core::read_progress::{ReadProgress, ReadSnapshot};
use etlantic_runtime::progress::QueryProgress;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// One line redrawn in place (a terminal).
    Bar,
    /// A line now and then, and one at the end.
    Lines,
    /// Nothing.
    Off,
}

impl Style {
    /// `ETLANTIC_PROGRESS` (`bar`, `lines` or `off`) when set, else a bar when stderr is a
    /// terminal and lines otherwise.
    pub fn detect() -> Style {
        match std::env::var("ETLANTIC_PROGRESS").as_deref() {
            Ok("bar") => Style::Bar,
            Ok("lines") => Style::Lines,
            Ok("off") => Style::Off,
            _ if std::io::IsTerminal::is_terminal(&std::io::stderr()) => Style::Bar,
            _ => Style::Lines,
        }
    }
}

/// How often a bar is redrawn, and a line printed.
const BAR_EVERY: Duration = Duration::from_millis(200);
const LINE_EVERY: Duration = Duration::from_secs(10);

/// The figures shown.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    /// Files read (completed reads, plus the files done of the read going on).
    pub files_done: u64,
    /// Files known in all: read, being read and waiting (0 when unknown).
    pub files_total: u64,
    /// Bytes of the files done.
    pub bytes_done: u64,
    /// Bytes in all (0 when unknown).
    pub bytes_total: u64,
    /// Records read.
    pub rows: u64,
    /// Records still to read (a log's backlog), when known.
    pub rows_waiting: Option<u64>,
    /// Micro-batches done (0 for a batch run).
    pub batches: u64,
    /// Time since the work began.
    pub elapsed: Duration,
}

impl Figures {
    /// The fraction done, from files (else records), when a total is known.
    pub fn fraction(&self) -> Option<f64> {
        if self.files_total > 0 {
            return Some((self.files_done as f64 / self.files_total as f64).min(1.0));
        }
        let waiting = self.rows_waiting?;
        let all = self.rows + waiting;
        (all > 0).then(|| self.rows as f64 / all as f64)
    }

    /// The text after the bar (or the whole line): `3/8 files  12.0 MB/30.1 MB  1,234 rows
    /// 4 batches  0:05`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.files_total > 0 {
            parts.push(format!("{}/{} files", self.files_done, self.files_total));
        }
        if self.bytes_total > 0 {
            parts.push(format!(
                "{}/{}",
                crate::status::bytes(self.bytes_done),
                crate::status::bytes(self.bytes_total)
            ));
        }
        match self.rows_waiting {
            Some(w) => parts.push(format!(
                "{} rows, {} waiting",
                grouped(self.rows),
                grouped(w)
            )),
            None => parts.push(format!("{} rows", grouped(self.rows))),
        }
        if self.batches > 0 {
            let s = if self.batches == 1 { "" } else { "es" };
            parts.push(format!("{} batch{s}", self.batches));
        }
        parts.push(clock(self.elapsed));
        if let Some(eta) = self.eta() {
            parts.push(format!("ETA {}", clock(eta)));
        }
        parts.join("  ")
    }

    /// The time left at the pace so far, once there is a pace.
    fn eta(&self) -> Option<Duration> {
        let f = self.fraction()?;
        if f <= 0.0 || f >= 1.0 || self.elapsed < Duration::from_secs(1) {
            return None;
        }
        Some(self.elapsed.mul_f64((1.0 - f) / f))
    }

    /// A bar of `width` cells for the fraction done.
    pub fn bar(&self, width: usize) -> String {
        match self.fraction() {
            Some(f) => {
                let full = ((f * width as f64).round() as usize).min(width);
                format!("[{}{}]", "=".repeat(full), " ".repeat(width - full))
            }
            None => format!("[{}]", "?".repeat(width)),
        }
    }
}

/// `1234567` as `1,234,567`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `m:ss` (or `h:mm:ss`).
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    match s >= 3600 {
        true => format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60),
        false => format!("{}:{:02}", s / 60, s % 60),
    }
}

struct State {
    style: Style,
    what: &'static str,
    /// Micro-batches are counted (a streaming run).
    streaming: bool,
    sources: Vec<Arc<ReadProgress>>,
    /// Files, bytes and records of the reads completed (micro-batches done).
    completed: ReadSnapshot,
    files_waiting: u64,
    bytes_waiting: u64,
    rows_waiting: Option<u64>,
    batches: u64,
    started: Instant,
    last_line: Option<Instant>,
    /// What the last line or bar showed (nothing is printed again while it holds).
    shown: Option<String>,
    /// A bar is on the screen (a line printed now must clear it first).
    drawn: bool,
}

impl State {
    fn figures(&self) -> Figures {
        // The read going on; between micro-batches its counters are zero (`batch_done`
        // takes them in and resets them).
        let mut now = ReadSnapshot::default();
        for r in &self.sources {
            let r = r.snapshot();
            now.files_done += r.files_done;
            now.files_total += r.files_total;
            now.bytes_done += r.bytes_done;
            now.bytes_total += r.bytes_total;
            now.rows += r.rows;
        }
        let c = &self.completed;
        let bytes_known = c.bytes_done + now.bytes_total + self.bytes_waiting > 0;
        Figures {
            files_done: c.files_done + now.files_done,
            files_total: c.files_done + now.files_total + self.files_waiting,
            bytes_done: c.bytes_done + now.bytes_done,
            bytes_total: match bytes_known {
                true => c.bytes_done + now.bytes_total + self.bytes_waiting,
                false => 0,
            },
            rows: c.rows + now.rows,
            rows_waiting: self.rows_waiting,
            batches: self.batches,
            elapsed: self.started.elapsed(),
        }
    }

    fn line(&self, f: &Figures) -> String {
        match self.style {
            Style::Bar => format!("{} {} {}", self.what, f.bar(24), f.describe()),
            _ => format!("{}: {}", self.what, f.describe()),
        }
    }

    /// Shows the figures now if they changed: redraws the bar, or prints a line when
    /// `LINE_EVERY` has passed (`force`: whatever the time).
    fn show(&mut self, force: bool) {
        let f = self.figures();
        let text = self.line(&f);
        if self.shown.as_deref() == Some(text.as_str()) {
            return;
        }
        let mut err = std::io::stderr().lock();
        match self.style {
            Style::Bar => {
                let _ = write!(err, "\r\x1b[2K{text}");
                self.drawn = true;
            }
            Style::Lines => {
                if !force && self.last_line.is_some_and(|t| t.elapsed() < LINE_EVERY) {
                    return;
                }
                let _ = writeln!(err, "{text}");
                self.last_line = Some(Instant::now());
            }
            Style::Off => return,
        }
        let _ = err.flush();
        self.shown = Some(text);
    }

    fn clear(&mut self) {
        if self.drawn {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            self.drawn = false;
            self.shown = None;
        }
    }
}

/// The progress of one run, shown until [`ProgressView::finish`].
pub struct ProgressView {
    state: Arc<Mutex<State>>,
    poll: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl ProgressView {
    /// A view of a batch run's reads (`streaming` false) or of a streaming run's
    /// micro-batches, shown in `style`.
    pub fn new(style: Style, streaming: bool) -> Arc<Self> {
        Arc::new(ProgressView {
            state: Arc::new(Mutex::new(State {
                style,
                what: if streaming { "backfill" } else { "reading" },
                streaming,
                sources: Vec::new(),
                completed: ReadSnapshot::default(),
                files_waiting: 0,
                bytes_waiting: 0,
                rows_waiting: None,
                batches: 0,
                started: Instant::now(),
                last_line: None,
                shown: None,
                drawn: false,
            })),
            poll: Mutex::new(None),
        })
    }

    /// Watches the reads of `sources` from now on, redrawing as they go (inside a tokio
    /// runtime).
    pub fn watch(&self, sources: Vec<Arc<ReadProgress>>) {
        let style = match self.state.lock() {
            Ok(mut s) => {
                s.sources = sources;
                s.started = Instant::now();
                s.style
            }
            Err(_) => return,
        };
        let every = match style {
            Style::Bar => BAR_EVERY,
            Style::Lines => LINE_EVERY,
            Style::Off => return,
        };
        let state = self.state.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Ok(mut s) = state.lock() {
                    s.show(false);
                }
            }
        });
        if let Ok(mut p) = self.poll.lock() {
            *p = Some(task);
        }
    }

    /// Takes in a finished micro-batch: what its sources read, and their backlog.
    pub fn batch_done(&self, p: &QueryProgress) {
        let Ok(mut s) = self.state.lock() else { return };
        let reads: Vec<ReadSnapshot> = s.sources.iter().map(|r| r.snapshot()).collect();
        for r in &reads {
            s.completed.files_done += r.files_done;
            s.completed.bytes_done += r.bytes_done;
        }
        // Rows from the record: every source counts them, not only those with a reader.
        s.completed.rows += p.num_input_rows;
        for r in &s.sources {
            // Taken in: the next micro-batch's read counts from zero.
            r.begin(0, 0);
        }
        let backlog = p.sources.iter().filter_map(|x| x.backlog);
        let (mut files, mut bytes, mut records, mut any_records) = (0, 0, 0, false);
        for b in backlog {
            files += b.files.unwrap_or(0);
            bytes += b.bytes.unwrap_or(0);
            if let Some(r) = b.records {
                records += r;
                any_records = true;
            }
        }
        s.files_waiting = files;
        s.bytes_waiting = bytes;
        s.rows_waiting = any_records.then_some(records);
        if s.streaming {
            s.batches += 1;
        }
        s.show(false);
    }

    /// Prints `text` as a line of its own (above the bar, which is redrawn after it).
    pub fn println(&self, text: &str) {
        let Ok(mut s) = self.state.lock() else {
            eprintln!("{text}");
            return;
        };
        s.clear();
        eprintln!("{text}");
        if s.style == Style::Bar {
            s.show(true);
        }
    }

    /// Stops showing: the last figures stay on the screen (a bar ends its line).
    pub fn finish(&self) {
        if let Some(task) = self.poll.lock().ok().and_then(|mut p| p.take()) {
            task.abort();
        }
        let Ok(mut s) = self.state.lock() else { return };
        if s.style == Style::Off {
            return;
        }
        s.shown = None;
        s.show(true);
        if s.drawn {
            eprintln!();
            s.drawn = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_as_a_bar_and_a_line() {
        let f = Figures {
            files_done: 3,
            files_total: 12,
            bytes_done: 1_500_000,
            bytes_total: 6_000_000,
            rows: 1_234_567,
            rows_waiting: None,
            batches: 2,
            elapsed: Duration::from_secs(65),
        };
        assert_eq!(f.fraction(), Some(0.25));
        assert_eq!(f.bar(8), "[==      ]");
        assert_eq!(
            f.describe(),
            format!(
                "3/12 files  {}/{}  1,234,567 rows  2 batches  1:05  ETA 3:15",
                crate::status::bytes(1_500_000),
                crate::status::bytes(6_000_000)
            )
        );
    }

    #[test]
    fn a_log_backlog_gives_the_fraction_when_no_files_are_known() {
        let f = Figures {
            rows: 300,
            rows_waiting: Some(100),
            elapsed: Duration::from_millis(500),
            ..Figures::default()
        };
        assert_eq!(f.fraction(), Some(0.75));
        assert_eq!(f.describe(), "300 rows, 100 waiting  0:00");
        let unknown = Figures::default();
        assert_eq!(unknown.fraction(), None);
        assert_eq!(unknown.bar(3), "[???]");
    }

    #[test]
    fn numbers_and_clocks_for_people() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(12_345_678), "12,345,678");
        assert_eq!(clock(Duration::from_secs(59)), "0:59");
        assert_eq!(clock(Duration::from_secs(3_725)), "1:02:05");
    }

    #[test]
    fn a_micro_batch_moves_the_reads_into_the_completed_figures() {
        let read = Arc::new(ReadProgress::default());
        let view = ProgressView::new(Style::Off, true);
        view.state.lock().unwrap().sources = vec![read.clone()];
        read.begin(2, 200);
        read.file_done(100, 5);
        let f = view.state.lock().unwrap().figures();
        assert_eq!((f.files_done, f.files_total, f.rows), (1, 2, 5));
        read.file_done(100, 6);
        let p = QueryProgress {
            num_input_rows: 11,
            sources: vec![etlantic_runtime::progress::SourceProgress {
                backlog: Some(etlantic_core::data::Backlog {
                    records: None,
                    files: Some(3),
                    bytes: Some(300),
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        view.batch_done(&p);
        let f = view.state.lock().unwrap().figures();
        assert_eq!((f.files_done, f.files_total), (2, 5));
        assert_eq!((f.bytes_done, f.bytes_total), (200, 500));
        assert_eq!((f.rows, f.batches), (11, 1));
        assert_eq!(f.fraction(), Some(0.4));
    }
}
