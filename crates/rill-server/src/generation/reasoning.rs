//! Thinking apart from the answer. Reasoning models write their thinking in a syntax of their
//! family, found in their chat template: between `<think>` and `</think>` (Qwen3 and 3.5,
//! DeepSeek-R1 distills, SmolLM3, QwQ...), in Gemma 4's thought channel (`<|channel>thought` …
//! `<channel|>`), or in gpt-oss's harmony channels (`analysis` is thinking, `final` the answer,
//! `commentary` addressed `to=functions.NAME` a tool call). [`ReasoningSplit`] reads an answer's
//! text as it grows (with control tokens spelled out) and says which part is which.

/// How a model family writes its thinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReasoningSyntax {
    /// Thinking between two markers, at the start of the answer (or the prompt opened it).
    Tags {
        open: &'static str,
        close: &'static str,
    },
    /// gpt-oss's harmony format.
    Harmony,
}

const THINK: ReasoningSyntax = ReasoningSyntax::Tags {
    open: "<think>",
    close: "</think>",
};
const GEMMA4_THOUGHT: ReasoningSyntax = ReasoningSyntax::Tags {
    open: "<|channel>thought",
    close: "<channel|>",
};

impl ReasoningSyntax {
    /// The syntax a chat template's model thinks in, if it is a reasoning model's.
    pub(crate) fn detect(template: Option<&str>) -> Option<ReasoningSyntax> {
        let t = template?;
        if t.contains("<|channel|>") && t.contains("<|message|>") {
            Some(ReasoningSyntax::Harmony)
        } else if t.contains("<|channel>") && t.contains("<channel|>") {
            Some(GEMMA4_THOUGHT)
        } else if t.contains("<think>") && t.contains("</think>") {
            Some(THINK)
        } else {
            None
        }
    }
}

impl ReasoningSyntax {
    /// A budget of `tokens` for this syntax: what opens the thinking, what is forced to close
    /// it, and what shows the model closed it; `prompt` says whether it opened the thinking.
    pub(crate) fn budget(self, tokens: usize, prompt: &str) -> rill_engine::ThinkingBudget {
        let (open, close, closed_by) = match self {
            ReasoningSyntax::Tags { open, close } if open == "<think>" => {
                (open, "\n</think>\n\n", close)
            }
            ReasoningSyntax::Tags { open, close } => (open, close, close),
            ReasoningSyntax::Harmony => (
                "<|channel|>analysis<|message|>",
                "<|end|><|start|>assistant<|channel|>final<|message|>",
                "<|end|>",
            ),
        };
        let starts_inside = match self {
            ReasoningSyntax::Tags { open, .. } => prompt.trim_end().ends_with(open),
            ReasoningSyntax::Harmony => false,
        };
        rill_engine::ThinkingBudget {
            tokens,
            open: open.to_string(),
            close: close.to_string(),
            closed_by: closed_by.to_string(),
            starts_inside,
        }
    }
}

/// The thinking budget of a reasoning effort (rill's mapping of OpenAI's and Ollama's levels):
/// `minimal` 256 tokens, `low` 1,024, `medium` 4,096, `high` 16,384, `xhigh`/`max` none;
/// `None` for a level it does not know.
pub(crate) fn effort_budget(effort: &str) -> Option<Option<usize>> {
    match effort {
        "minimal" => Some(Some(256)),
        "low" => Some(Some(1024)),
        "medium" => Some(Some(4096)),
        "high" => Some(Some(16384)),
        "xhigh" | "max" => Some(None),
        _ => None,
    }
}

/// A part of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    Reasoning(String),
    Content(String),
    /// A harmony tool call begins (`to=functions.NAME`).
    CallStart(String),
    /// More of the current harmony call's arguments.
    CallArguments(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TagState {
    /// At the start of the answer: thinking may open here.
    Start,
    Thinking,
    /// Just after the closing marker: the whitespace before the answer is dropped.
    Closed,
    Answer,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HarmonyState {
    /// Reading a message's header (up to `<|message|>`).
    Header,
    /// In a message's body of this kind.
    Body(HarmonyKind),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HarmonyKind {
    Reasoning,
    Content,
    Call,
}

/// Splits an answer's text into thinking and answer as it grows.
#[derive(Debug, Clone)]
pub(crate) struct ReasoningSplit {
    syntax: ReasoningSyntax,
    tags: TagState,
    harmony: HarmonyState,
    /// Text not yet classified (a marker may be starting at its end).
    held: String,
    /// Whitespace at the end of the thinking, held until more thinking follows it.
    trailing: String,
    /// Whether the current thinking has begun (whitespace before it is dropped).
    think_started: bool,
}

impl ReasoningSplit {
    /// A split for an answer that follows `prompt` (the rendered prompt's text: a template
    /// that opens the thinking in the prompt makes the answer start inside it).
    pub(crate) fn new(syntax: ReasoningSyntax, prompt: &str) -> ReasoningSplit {
        let tags = match syntax {
            ReasoningSyntax::Tags { open, .. } if prompt.trim_end().ends_with(open) => {
                TagState::Thinking
            }
            ReasoningSyntax::Tags { .. } => TagState::Start,
            ReasoningSyntax::Harmony => TagState::Answer,
        };
        ReasoningSplit {
            syntax,
            tags,
            harmony: HarmonyState::Header,
            held: String::new(),
            trailing: String::new(),
            think_started: false,
        }
    }

    /// Whether the answer is (still) inside its thinking.
    pub(crate) fn thinking(&self) -> bool {
        match self.syntax {
            ReasoningSyntax::Tags { .. } => self.tags == TagState::Thinking,
            ReasoningSyntax::Harmony => {
                self.harmony == HarmonyState::Body(HarmonyKind::Reasoning)
                    || self.harmony == HarmonyState::Header
            }
        }
    }

    /// The parts `text` (the answer's next piece) completes.
    pub(crate) fn push(&mut self, text: &str) -> Vec<Part> {
        self.held.push_str(text);
        let mut out = Vec::new();
        match self.syntax {
            ReasoningSyntax::Tags { open, close } => self.tags(open, close, false, &mut out),
            ReasoningSyntax::Harmony => self.harmony(false, &mut out),
        }
        merge(out)
    }

    /// The parts of whatever is held back, at the answer's end.
    pub(crate) fn finish(&mut self) -> Vec<Part> {
        let mut out = Vec::new();
        match self.syntax {
            ReasoningSyntax::Tags { open, close } => self.tags(open, close, true, &mut out),
            ReasoningSyntax::Harmony => self.harmony(true, &mut out),
        }
        merge(out)
    }

    fn think(&mut self, text: &str, out: &mut Vec<Part>) {
        let text = if self.think_started {
            text
        } else {
            text.trim_start()
        };
        if text.is_empty() {
            return;
        }
        self.think_started = true;
        let body = text.trim_end();
        if body.is_empty() {
            self.trailing.push_str(text);
            return;
        }
        let mut s = std::mem::take(&mut self.trailing);
        s.push_str(body);
        self.trailing = text[body.len()..].to_string();
        out.push(Part::Reasoning(s));
    }

    /// A thinking section ended: its trailing whitespace is dropped.
    fn end_thinking(&mut self) {
        self.trailing.clear();
        self.think_started = false;
    }

    fn tags(&mut self, open: &str, close: &str, end: bool, out: &mut Vec<Part>) {
        loop {
            match self.tags {
                TagState::Start => {
                    let s = self.held.trim_start();
                    if let Some(rest) = s.strip_prefix(open) {
                        self.held = rest.trim_start().to_string();
                        self.tags = TagState::Thinking;
                    } else if !end && open.starts_with(s) {
                        return;
                    } else {
                        self.tags = TagState::Answer;
                    }
                }
                TagState::Thinking => {
                    if let Some(at) = self.held.find(close) {
                        let before = self.held[..at].to_string();
                        self.held.drain(..at + close.len());
                        self.think(&before, out);
                        self.end_thinking();
                        self.tags = TagState::Closed;
                        continue;
                    }
                    let keep = if end {
                        self.held.len()
                    } else {
                        safe_prefix(&self.held, close)
                    };
                    let text: String = self.held.drain(..keep).collect();
                    self.think(&text, out);
                    if end {
                        self.end_thinking();
                    }
                    return;
                }
                TagState::Closed => {
                    let s = self.held.trim_start();
                    if s.is_empty() {
                        self.held.clear();
                        return;
                    }
                    self.held = s.to_string();
                    self.tags = TagState::Answer;
                }
                TagState::Answer => {
                    if !self.held.is_empty() {
                        out.push(Part::Content(std::mem::take(&mut self.held)));
                    }
                    return;
                }
            }
        }
    }

    fn harmony(&mut self, end: bool, out: &mut Vec<Part>) {
        const MESSAGE: &str = "<|message|>";
        const ENDS: [&str; 3] = ["<|end|>", "<|return|>", "<|call|>"];
        loop {
            match self.harmony.clone() {
                HarmonyState::Header => {
                    let Some(at) = self.held.find(MESSAGE) else {
                        if end {
                            self.held.clear();
                        }
                        return;
                    };
                    let header = self.held[..at].to_string();
                    self.held.drain(..at + MESSAGE.len());
                    let kind = harmony_kind(&header);
                    if let (HarmonyKind::Call, Some(name)) = (&kind, harmony_recipient(&header)) {
                        out.push(Part::CallStart(name));
                    }
                    self.harmony = HarmonyState::Body(kind);
                }
                HarmonyState::Body(kind) => {
                    let found = ENDS
                        .iter()
                        .filter_map(|m| self.held.find(m).map(|at| (at, m.len())))
                        .min();
                    let (text, done) = match found {
                        Some((at, len)) => {
                            let text = self.held[..at].to_string();
                            self.held.drain(..at + len);
                            (text, true)
                        }
                        None => {
                            let keep = if end {
                                self.held.len()
                            } else {
                                ENDS.iter()
                                    .map(|m| safe_prefix(&self.held, m))
                                    .min()
                                    .unwrap_or(0)
                            };
                            (self.held.drain(..keep).collect(), false)
                        }
                    };
                    match kind {
                        HarmonyKind::Reasoning => self.think(&text, out),
                        HarmonyKind::Content if !text.is_empty() => out.push(Part::Content(text)),
                        HarmonyKind::Call if !text.is_empty() => {
                            out.push(Part::CallArguments(text))
                        }
                        _ => {}
                    }
                    if !done {
                        return;
                    }
                    if kind == HarmonyKind::Reasoning {
                        self.end_thinking();
                    }
                    self.harmony = HarmonyState::Header;
                }
            }
        }
    }
}

/// What a harmony message header (`<|start|>assistant<|channel|>analysis`, or
/// `<|channel|>commentary to=functions.f <|constrain|>json`) makes its body.
fn harmony_kind(header: &str) -> HarmonyKind {
    if harmony_recipient(header).is_some() {
        return HarmonyKind::Call;
    }
    let channel = header
        .rsplit("<|channel|>")
        .next()
        .unwrap_or("")
        .split_whitespace()
        .next()
        .unwrap_or("");
    match channel {
        "analysis" => HarmonyKind::Reasoning,
        _ => HarmonyKind::Content,
    }
}

/// The function a harmony header addresses (`to=functions.NAME`).
fn harmony_recipient(header: &str) -> Option<String> {
    let at = header.find("to=functions.")?;
    let name: String = header[at + "to=functions.".len()..]
        .chars()
        .take_while(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
        .collect();
    (!name.is_empty()).then_some(name)
}

/// The longest prefix of `s` after which no part of `marker` can be starting.
fn safe_prefix(s: &str, marker: &str) -> usize {
    for k in (1..marker.len().min(s.len() + 1)).rev() {
        if s.is_char_boundary(s.len() - k) && marker.starts_with(&s[s.len() - k..]) {
            return s.len() - k;
        }
    }
    s.len()
}

/// Adjacent parts of one kind joined.
fn merge(parts: Vec<Part>) -> Vec<Part> {
    let mut out: Vec<Part> = Vec::with_capacity(parts.len());
    for p in parts {
        match (out.last_mut(), p) {
            (Some(Part::Reasoning(a)), Part::Reasoning(b)) => a.push_str(&b),
            (Some(Part::Content(a)), Part::Content(b)) => a.push_str(&b),
            (Some(Part::CallArguments(a)), Part::CallArguments(b)) => a.push_str(&b),
            (_, p) => out.push(p),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `step` characters and collects the reasoning and the content.
    fn split(syntax: ReasoningSyntax, prompt: &str, text: &str, step: usize) -> Vec<Part> {
        let mut s = ReasoningSplit::new(syntax, prompt);
        let chars: Vec<char> = text.chars().collect();
        let mut out = Vec::new();
        for piece in chars.chunks(step) {
            out.extend(s.push(&piece.iter().collect::<String>()));
        }
        out.extend(s.finish());
        merge(out)
    }

    fn every_step(syntax: ReasoningSyntax, prompt: &str, text: &str, want: &[Part]) {
        for step in 1..=text.chars().count().max(1) {
            assert_eq!(
                split(syntax, prompt, text, step),
                want,
                "pieces of {step} of {text:?}"
            );
        }
    }

    #[test]
    fn think_tags_at_the_answers_start() {
        let want = [
            Part::Reasoning("Let me add.\n2 + 2 = 4".into()),
            Part::Content("The answer is 4.".into()),
        ];
        every_step(
            THINK,
            "<|im_start|>assistant\n",
            "<think>\nLet me add.\n2 + 2 = 4\n</think>\n\nThe answer is 4.",
            &want,
        );
    }

    #[test]
    fn a_prompt_that_opens_the_thinking() {
        // DeepSeek-R1 distills and Qwen3.5 open `<think>` in the generation prompt.
        every_step(
            THINK,
            "<｜Assistant｜><think>\n",
            "hmm\n</think>\n\nYes.",
            &[Part::Reasoning("hmm".into()), Part::Content("Yes.".into())],
        );
        // Cut by the length limit while thinking: all of it is thinking.
        every_step(
            THINK,
            "<think>\n",
            "still going <th",
            &[Part::Reasoning("still going <th".into())],
        );
    }

    #[test]
    fn no_thinking_is_all_answer() {
        every_step(
            THINK,
            "assistant\n",
            "Hello <think> is a tag",
            &[Part::Content("Hello <think> is a tag".into())],
        );
        every_step(
            THINK,
            "assistant\n",
            "<thin",
            &[Part::Content("<thin".into())],
        );
        // Qwen3 with enable_thinking=false: an empty block in the prompt.
        every_step(
            THINK,
            "<|im_start|>assistant\n<think>\n\n</think>\n\n",
            "Hi.",
            &[Part::Content("Hi.".into())],
        );
    }

    #[test]
    fn gemma4_thought_channel() {
        every_step(
            GEMMA4_THOUGHT,
            "<start_of_turn>model\n",
            "<|channel>thought\nPlan: greet.<channel|>Hello!",
            &[
                Part::Reasoning("Plan: greet.".into()),
                Part::Content("Hello!".into()),
            ],
        );
        // Thinking off: the prompt holds an empty thought channel.
        every_step(
            GEMMA4_THOUGHT,
            "<|turn>model\n<|channel>thought\n<channel|>",
            "Hello!",
            &[Part::Content("Hello!".into())],
        );
    }

    #[test]
    fn harmony_channels() {
        let text = "<|channel|>analysis<|message|>User wants weather. Call tool.<|end|>\
                    <|start|>assistant<|channel|>commentary to=functions.get_weather \
                    <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
        every_step(
            ReasoningSyntax::Harmony,
            "<|start|>assistant",
            text,
            &[
                Part::Reasoning("User wants weather. Call tool.".into()),
                Part::CallStart("get_weather".into()),
                Part::CallArguments("{\"city\":\"Paris\"}".into()),
            ],
        );
        let text = "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant\
                    <|channel|>final<|message|>Hi there!<|return|>";
        every_step(
            ReasoningSyntax::Harmony,
            "<|start|>assistant",
            text,
            &[
                Part::Reasoning("Simple.".into()),
                Part::Content("Hi there!".into()),
            ],
        );
    }

    #[test]
    fn detects_the_families() {
        assert_eq!(
            ReasoningSyntax::detect(Some("{{ '<think>' }}..</think>")),
            Some(THINK)
        );
        assert_eq!(
            ReasoningSyntax::detect(Some("<|start|>{{ x }}<|channel|>analysis<|message|>")),
            Some(ReasoningSyntax::Harmony)
        );
        assert_eq!(
            ReasoningSyntax::detect(Some("'<|channel>thought\\n<channel|>'")),
            Some(GEMMA4_THOUGHT)
        );
        assert_eq!(ReasoningSyntax::detect(Some("<|im_start|>")), None);
        assert_eq!(ReasoningSyntax::detect(None), None);
    }
}
