//! Whether a prompt goes through a chat template: base models run raw by default, and the end
//! line says which template was applied.

use rill_tokenizer::Tokenizer;

/// Which template the prompt went through, in words (the end line says it).
pub fn template_note(tokenizer: &Tokenizer, asked_raw: bool, raw: bool) -> String {
    use rill_tokenizer::ChatTemplateSource;
    if asked_raw {
        return "no chat template (--raw)".into();
    }
    if raw {
        return "no chat template: a base model (the file has none and its name says nothing of \
                instruction tuning; --chat applies one)"
            .into();
    }
    match tokenizer.chat_template_source() {
        Some(ChatTemplateSource::Metadata) => "the file's chat template".into(),
        Some(ChatTemplateSource::BuiltinGemma) => {
            "the built-in Gemma 3 chat template (the file has none)".into()
        }
        Some(ChatTemplateSource::BuiltinChatMl) => {
            "the built-in ChatML template (the file has none)".into()
        }
        None => "no chat template (the file has none)".into(),
    }
}

/// Whether a file looks like a base (pretrained, not instruction-tuned) model: it carries no
/// chat template and nothing in its name says otherwise (`general.name`, `basename`,
/// `finetune`: no "it", "instruct", "chat", "sft", "dpo", "rlhf" or "assistant" among their words;
/// a `finetune` other than "base", "pt" or "pretrained" counts as tuned). Gemma 3 270M's base
/// file: "Gemma 3 270m", no template.
pub fn looks_like_base_model(meta: &rill_gguf::Metadata) -> bool {
    if meta.get("tokenizer.chat_template").is_some() {
        return false;
    }
    let text = |k: &str| {
        meta.get(k)
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_lowercase()
    };
    let finetune = text("general.finetune");
    if !finetune.is_empty() && !["base", "pt", "pretrained"].contains(&finetune.as_str()) {
        return false;
    }
    let names = [text("general.name"), text("general.basename"), finetune];
    const TUNED: [&str; 7] = ["it", "instruct", "chat", "sft", "dpo", "rlhf", "assistant"];
    !names
        .iter()
        .flat_map(|n| n.split(|c: char| !c.is_ascii_alphanumeric()))
        .any(|word| TUNED.contains(&word))
}
