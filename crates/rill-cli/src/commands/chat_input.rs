//! Where `rill chat`'s messages come from: at a terminal, a line editor (editing, history kept
//! per model in the cache directory, multi-line input between `"""` lines or after a trailing
//! `\`); otherwise standard input's lines as they are.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::Result;
use rustyline::error::ReadlineError;

/// What the next read gave.
pub enum Read {
    Message(String),
    /// Ctrl-D, `/exit`-less end of input, or Ctrl-C twice at the prompt.
    Leave,
}

pub enum Input {
    Editor {
        editor: Box<rustyline::DefaultEditor>,
        history: Option<PathBuf>,
    },
    Lines(std::io::Lines<std::io::StdinLock<'static>>),
}

/// Where a model's chat history is kept: `<cache>/rill/history/<file name>.txt` (beside the
/// models' cache, `$RILL_HOME/history` when that is set).
fn history_path(model: &Path) -> Option<PathBuf> {
    let models = rill_fetch::models_dir().ok()?;
    let name = model.file_name()?.to_string_lossy().into_owned();
    Some(models.parent()?.join("history").join(format!("{name}.txt")))
}

impl Input {
    /// The line editor where standard input is a terminal (and the editor starts), else lines.
    pub fn new(model: &Path) -> Input {
        if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
            if let Ok(mut editor) = rustyline::DefaultEditor::new() {
                let history = history_path(model);
                if let Some(p) = &history {
                    let _ = editor.load_history(p);
                }
                return Input::Editor {
                    editor: Box::new(editor),
                    history,
                };
            }
        }
        Input::Lines(std::io::stdin().lock().lines())
    }

    pub fn interactive(&self) -> bool {
        matches!(self, Input::Editor { .. })
    }

    /// The next message: one line, or several (between `"""` lines, or joined where a line
    /// ends with `\`).
    pub fn read(&mut self) -> Result<Read> {
        let Some(first) = self.line("> ")? else {
            return Ok(Read::Leave);
        };
        if first.trim() == "\"\"\"" {
            let mut lines = Vec::new();
            loop {
                match self.line("... ")? {
                    Some(l) if l.trim() == "\"\"\"" => break,
                    Some(l) => lines.push(l),
                    None => break,
                }
            }
            return Ok(Read::Message(self.remember(lines.join("\n"))));
        }
        let mut text = first;
        while let Some(head) = text.strip_suffix('\\') {
            let head = head.to_string();
            match self.line("... ")? {
                Some(next) => text = format!("{head}\n{next}"),
                None => {
                    text = head;
                    break;
                }
            }
        }
        Ok(Read::Message(self.remember(text)))
    }

    /// One line; `None` at the end of input (Ctrl-D) or after Ctrl-C twice in a row.
    fn line(&mut self, prompt: &str) -> Result<Option<String>> {
        match self {
            Input::Lines(lines) => Ok(lines.next().transpose()?),
            Input::Editor { editor, .. } => {
                let mut interrupted = false;
                loop {
                    match editor.readline(prompt) {
                        Ok(line) => return Ok(Some(line)),
                        Err(ReadlineError::Interrupted) if !interrupted => {
                            interrupted = true;
                            eprintln!("(Ctrl-C again or Ctrl-D to leave)");
                        }
                        Err(ReadlineError::Interrupted | ReadlineError::Eof) => return Ok(None),
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
    }

    /// Adds a message to the editor's history (and the model's history file).
    fn remember(&mut self, text: String) -> String {
        if let Input::Editor { editor, history } = self {
            if !text.trim().is_empty() {
                let _ = editor.add_history_entry(text.as_str());
                if let Some(p) = history {
                    if let Some(dir) = p.parent() {
                        let _ = std::fs::create_dir_all(dir);
                    }
                    let _ = editor.save_history(p);
                }
            }
        }
        text
    }
}
