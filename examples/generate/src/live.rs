//! Terminal feedback while decoding: the canvas being denoised (on a TTY) or a progress bar.

use console::Term;
use dllm_decode::{Control, StepEvent, StepObserver};
use dllm_models::TextTokenizer;
use indicatif::{ProgressBar, ProgressStyle};

/// Redraws the generated region in place after every step; masks show as `░`.
pub struct LiveCanvas {
    term: Term,
    tok: Option<TextTokenizer>,
    lines: usize,
    total: usize,
    stop_ids: Vec<u32>,
}

impl LiveCanvas {
    /// Animate `total` generated positions; `stop_ids` (EOS, EoT) show as `⏎` — the printed answer
    /// ends at the first of them, so the canvas shows where.
    pub fn new(tok: Option<TextTokenizer>, total: usize, stop_ids: Vec<u32>) -> Self {
        Self {
            term: Term::stderr(),
            tok,
            lines: 0,
            total,
            stop_ids,
        }
    }

    fn render(&self, e: &StepEvent<'_>) -> String {
        let gen = &e.canvas[e.prompt_len..];
        let mut s = String::new();
        // Decode each run of unmasked tokens as a whole so the tokenizer restores its spacing.
        let mut run: Vec<u32> = Vec::new();
        let flush = |run: &mut Vec<u32>, s: &mut String| {
            if run.is_empty() {
                return;
            }
            match &self.tok {
                Some(t) => s.push_str(&t.decode(run, true).unwrap_or_else(|_| format!("{run:?}"))),
                None => s.push_str(&run.iter().map(|id| format!("{id} ")).collect::<String>()),
            }
            run.clear();
        };
        for &id in gen {
            if id == e.mask_id {
                flush(&mut run, &mut s);
                s.push('░');
            } else if self.stop_ids.contains(&id) {
                flush(&mut run, &mut s);
                s.push('⏎');
            } else {
                run.push(id);
            }
        }
        flush(&mut run, &mut s);
        let done = self.total - e.masked_left;
        format!(
            "{s}\n\x1b[2mblock {}/{} · step {} · {} forwards · {done}/{} tokens\x1b[0m",
            e.block + 1,
            e.num_blocks,
            e.step + 1,
            e.forwards,
            self.total
        )
    }
}

impl StepObserver for LiveCanvas {
    fn on_step(&mut self, e: &StepEvent<'_>) -> Control {
        let text = self.render(e);
        let width = self.term.size().1.max(20) as usize;
        let _ = self.term.clear_last_lines(self.lines);
        let _ = self.term.write_line(&text);
        self.lines = text
            .split('\n')
            .map(|l| console::measure_text_width(l).max(1).div_ceil(width))
            .sum();
        Control::Continue
    }
}

impl Drop for LiveCanvas {
    fn drop(&mut self) {
        let _ = self.term.clear_last_lines(self.lines);
    }
}

/// A progress bar over generated tokens (hidden when stderr is not a terminal).
pub struct Progress {
    pb: ProgressBar,
}

impl Progress {
    /// A bar over `total` tokens.
    pub fn new(total: usize) -> Self {
        let pb = ProgressBar::new(total as u64);
        pb.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} tokens [{elapsed_precise}] {msg}")
                .expect("valid template"),
        );
        Self { pb }
    }
}

impl StepObserver for Progress {
    fn on_step(&mut self, e: &StepEvent<'_>) -> Control {
        self.pb
            .set_position((e.canvas.len() - e.prompt_len - e.masked_left) as u64);
        self.pb
            .set_message(format!("step {} · {} forwards", e.step + 1, e.forwards));
        Control::Continue
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.pb.finish_and_clear();
    }
}
