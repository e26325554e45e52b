//! Library field names in command-line spelling: [`flag_of`] and [`cli_error`].

use anyhow::anyhow;

/// The command-line flag of a [`dllm_decode::DecodeParams`] field: the library's errors name fields
/// (`gen_length`, `revision.theta_visible`), the tools name flags (`--gen-length`, `--theta-visible`).
pub fn flag_of(field: &str) -> Option<&'static str> {
    FLAGS
        .iter()
        .find(|(f, _)| *f == field)
        .map(|(_, flag)| *flag)
}

/// Field paths and their flags (a boolean field's flag is the one that turns it off).
const FLAGS: &[(&str, &str)] = &[
    ("verify.allowance", "--verify-allowance"),
    ("theta_visible", "--theta-visible"),
    ("theta_stable", "--theta-stable"),
    ("near_wait.within", "--wait-near"),
    ("near_wait.below", "--wait-near-below"),
    ("tau_back", "--tau-back"),
    ("mbsd.draft_context", "--draft-context"),
    ("mbsd.refresh", "--refresh"),
    ("mbsd.budget_mib", "--lookahead-budget"),
    ("mbsd.allowance", "--lookahead-allowance"),
    ("mbsd.trigger", "--lookahead-trigger"),
    ("mbsd.lookahead", "--lookahead"),
    ("mbsd.fit_bucket", "--no-bucket-fit"),
    ("mbsd.fit_guess", "--fit-guess"),
    ("mbsd.span", "--span"),
    ("mbsd.sliding", "--no-sliding"),
    ("dream.alg_temp", "--alg-temp"),
    ("dream.top_p", "--top-p"),
    ("dream.top_k", "--top-k"),
    ("dream.eps", "--eps"),
    ("dream.alg", "--alg"),
    ("alg", "--alg"),
    ("confidence_eos_eot_inf", "--confidence-eos-eot-inf"),
    ("logits_eos_inf", "--logits-eos-inf"),
    ("block_length", "--block-length"),
    ("gen_length", "--gen-length"),
    ("cfg_scale", "--cfg-scale"),
    ("temperature", "--temperature"),
    ("threshold", "--threshold"),
    ("remasking", "--remasking"),
    ("strategy", "--strategy"),
    ("steps", "--steps"),
];

/// A decoding error in command-line spelling: the parameter and any field named in the reason
/// become flags (`invalid parameter `gen_length`` -> `invalid parameter `--gen-length``).
pub fn cli_error(e: dllm_decode::DecodeError) -> anyhow::Error {
    match e {
        dllm_decode::DecodeError::InvalidParam { name, reason } => {
            // A boolean field's flag turns it off: "turn revision.sts off" is "pass --no-sts",
            // and the field itself is on while that flag is not given.
            let mut reason = reason;
            for (field, flag) in FLAGS {
                if flag.starts_with("--no-") {
                    reason = reason
                        .replace(&format!("turn {field} off"), &format!("pass {flag}"))
                        .replace(field, &format!("{flag} not given"));
                }
            }
            // Longest field paths first, so `revision.theta_visible` is not cut by `threshold`.
            for (field, flag) in FLAGS {
                if (field.contains('.') || field.contains('_')) && !flag.starts_with("--no-") {
                    reason = reason.replace(field, flag);
                }
            }
            anyhow!(
                "invalid parameter `{}`: {reason}",
                flag_of(name).unwrap_or(name)
            )
        }
        other => anyhow::Error::new(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dllm_decode::{Decide, DecodeParams, MbsdParams, Staged, Strategy};

    #[test]
    fn library_field_names_become_flags() {
        let bad = DecodeParams {
            gen_length: 10,
            block_length: 4,
            ..Default::default()
        };
        let e = cli_error(bad.validate().unwrap_err()).to_string();
        assert!(
            e.contains("`--gen-length`") && e.contains("--block-length 4"),
            "{e}"
        );
        let p = DecodeParams {
            gen_length: 32,
            block_length: 32,
            steps: 32,
            strategy: Strategy::Mbsd(MbsdParams::default()),
            decide: Decide::Staged(Staged {
                visible: 0.99,
                ..Staged::default()
            }),
            ..Default::default()
        };
        let e = cli_error(p.validate().unwrap_err()).to_string();
        assert!(
            e.contains("`--theta-visible`") && e.contains("--theta-stable"),
            "{e}"
        );
        // Every field the library can name has a flag.
        for f in [
            "steps",
            "mbsd.trigger",
            "theta_visible",
            "dream.top_k",
            "cfg_scale",
        ] {
            assert!(flag_of(f).is_some(), "{f}");
        }
    }
}
