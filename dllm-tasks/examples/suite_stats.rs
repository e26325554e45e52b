//! Prints the suite's shape: examples per task, the tokenizer's vocabulary size, token
//! lengths, and optionally writes `tokenizer.json`.
//!
//! ```text
//! cargo run --release -p dllm-tasks --example suite_stats [-- --write-tokenizer PATH] [--samples N]
//! ```

use dllm_tasks::tokenizer::{self, encode_prompt, encode_response};
use dllm_tasks::{test_set, train_stream, TaskKind};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut write = None;
    let mut samples = 100_000usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--write-tokenizer" => write = Some(args.next().ok_or("--write-tokenizer PATH")?),
            "--samples" => samples = args.next().ok_or("--samples N")?.parse()?,
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let tok = tokenizer::build_suite_tokenizer()?;
    println!("vocab size: {}", tokenizer::tokenizer_vocab_size(&tok));
    for kind in TaskKind::ALL {
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
    for ex in train_stream(1)
        .take(samples)
        .chain(TaskKind::ALL.into_iter().flat_map(test_set))
    {
        let p = encode_prompt(&tok, &ex.prompt)?.len();
        let r = encode_response(&tok, &ex.response)?.len();
        let e = stats
            .entry(ex.kind)
            .or_insert((0usize, 0usize, 0usize, 0usize, 0usize));
        e.0 += 1;
        e.1 = e.1.max(p);
        e.2 += p;
        e.3 = e.3.max(r);
        e.4 += r;
    }
    println!("\ntask        n       prompt max/mean  response max/mean");
    for (k, (n, pm, ps, rm, rs)) in stats {
        println!(
            "{:<10} {n:>7}   {pm:>3} / {:>5.1}      {rm:>3} / {:>5.1}",
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
