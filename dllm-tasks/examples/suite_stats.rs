//! Prints the suite's shape: examples per task, the tokenizer's vocabulary size, token
//! lengths, and optionally writes `tokenizer.json`.
//!
//! ```text
//! cargo run --release -p dllm-tasks --example suite_stats [-- --suite short|long] [--write-tokenizer PATH] [--samples N]
//! ```

use dllm_tasks::tokenizer::{self, encode_prompt, encode_response};
use dllm_tasks::{suite_train_stream, test_set, Suite};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut write = None;
    let mut samples = 100_000usize;
    let mut suite = Suite::Short;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--write-tokenizer" => write = Some(args.next().ok_or("--write-tokenizer PATH")?),
            "--samples" => samples = args.next().ok_or("--samples N")?.parse()?,
            "--suite" => suite = args.next().ok_or("--suite short|long")?.parse()?,
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let tok = tokenizer::build_tokenizer(suite)?;
    println!("vocab size: {}", tokenizer::tokenizer_vocab_size(&tok));
    for kind in suite.tasks() {
        let ex = &test_set(kind)[0];
        println!("\n[{kind} / {}]", kind.paper_dataset());
        println!("  prompt:   {}", ex.prompt);
        println!("  response: {}", ex.response);
        let p = encode_prompt(&tok, &ex.prompt)?;
        let r = encode_response(&tok, &ex.response)?;
        let show = |ids: &[u32]| -> Vec<String> {
            ids.iter()
                .map(|&i| tok.id_to_token(i).unwrap_or_default())
                .collect()
        };
        println!("  prompt tokens ({}): {:?}", p.len(), show(&p));
        println!("  response tokens ({}): {:?}", r.len(), show(&r));
    }
    let mut stats = std::collections::BTreeMap::new();
    for ex in suite_train_stream(suite, 1)
        .take(samples)
        .chain(suite.tasks().into_iter().flat_map(test_set))
    {
        let p = encode_prompt(&tok, &ex.prompt)?.len();
        let r = encode_response(&tok, &ex.response)?.len();
        let e =
            stats
                .entry(ex.kind)
                .or_insert((0usize, 0usize, 0usize, 0usize, 0usize, usize::MAX));
        e.0 += 1;
        e.5 = e.5.min(r);
        e.1 = e.1.max(p);
        e.2 += p;
        e.3 = e.3.max(r);
        e.4 += r;
    }
    println!("\ntask          n       prompt max/mean  response min/max/mean");
    for (k, (n, pm, ps, rm, rs, rmin)) in stats {
        println!(
            "{:<12} {n:>7}   {pm:>3} / {:>5.1}      {rmin:>3} / {rm:>3} / {:>5.1}",
            k.name(),
            ps as f64 / n as f64,
            rs as f64 / n as f64
        );
    }
    if let Some(path) = write {
        tokenizer::save(&tok, &path)?;
        println!("wrote {path}");
    }
    Ok(())
}
