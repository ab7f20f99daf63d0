//! Stop strings over streamed text: text arrives in pieces (one per token), a stop string may be
//! split across pieces, and nothing of a stop string may ever reach the reader. So the tail that
//! could still become a stop string is held back until the text after it settles the question.

use crate::EngineError;

/// Finds stop strings in text pushed piece by piece.
///
/// [`StopMatcher::push`] appends to `out` all the text that can no longer be part of a stop
/// string and holds the rest back (the longest tail that is the start of some stop string).
/// The first stop string to be completed (the smallest end; on equal ends, the earliest start)
/// ends the stream: the text before it is emitted, the stop string and everything after it are
/// not. So what is emitted does not depend on how the text was split. At the end of a stream
/// without a match, [`StopMatcher::finish`] releases what is held.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    disarmed: bool,
    matched: Option<usize>,
}

impl StopMatcher {
    /// A matcher for `stops` (none is fine: then text passes straight through). An empty stop
    /// string is an error.
    pub fn new<S: AsRef<str>>(stops: &[S]) -> Result<StopMatcher, EngineError> {
        let stops: Vec<String> = stops.iter().map(|s| s.as_ref().to_string()).collect();
        if stops.iter().any(String::is_empty) {
            return Err(EngineError::BadParameter(
                "a stop string must not be empty".into(),
            ));
        }
        Ok(StopMatcher {
            stops,
            ..StopMatcher::default()
        })
    }

    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// Text held back: it might be the start of a stop string.
    pub fn held(&self) -> &str {
        &self.held
    }

    /// The stop string that ended the stream, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// While disarmed, pushes report no match (text is still held back, so a stop string that
    /// starts before the matcher is armed again and ends after is found). Generation disarms it
    /// until `min_tokens` tokens have been produced.
    pub fn set_armed(&mut self, armed: bool) {
        self.disarmed = !armed;
    }

    /// Adds `text`; appends what is safe to emit to `out`. Returns the index (in the list given
    /// to [`StopMatcher::new`]) of the stop string that this text completed, if any: the stream
    /// is then over, and later pushes emit nothing and return the same index.
    pub fn push(&mut self, text: &str, out: &mut String) -> Option<usize> {
        if self.matched.is_some() {
            return self.matched;
        }
        if self.stops.is_empty() {
            out.push_str(text);
            return None;
        }
        self.held.push_str(text);
        if !self.disarmed {
            // The first stop string completed: smallest end, then earliest start.
            let mut best: Option<(usize, usize, usize)> = None;
            for (i, s) in self.stops.iter().enumerate() {
                if let Some(start) = self.held.find(s.as_str()) {
                    let key = (start + s.len(), start, i);
                    if best.is_none_or(|b| (key.0, key.1) < (b.0, b.1)) {
                        best = Some(key);
                    }
                }
            }
            if let Some((_, start, i)) = best {
                out.push_str(&self.held[..start]);
                self.held.clear();
                self.matched = Some(i);
                return Some(i);
            }
        }
        let keep = self
            .stops
            .iter()
            .map(|s| partial_overlap(&self.held, s))
            .max()
            .unwrap_or(0);
        let emit = self.held.len() - keep;
        out.push_str(&self.held[..emit]);
        self.held.drain(..emit);
        None
    }

    /// Ends the stream: appends the held text to `out` (nothing after a match).
    pub fn finish(&mut self, out: &mut String) {
        if self.matched.is_none() {
            out.push_str(&self.held);
        }
        self.held.clear();
    }

    /// Ready for a new stream with the same stop strings.
    pub fn reset(&mut self) {
        self.held.clear();
        self.matched = None;
        self.disarmed = false;
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop`.
fn partial_overlap(text: &str, stop: &str) -> usize {
    let longest = text.len().min(stop.len() - 1);
    (1..=longest)
        .rev()
        .find(|&k| stop.is_char_boundary(k) && text.as_bytes().ends_with(&stop.as_bytes()[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<usize>) {
        let mut m = StopMatcher::new(stops).unwrap();
        let mut out = String::new();
        for p in pieces {
            if let Some(i) = m.push(p, &mut out) {
                return (out, Some(i));
            }
        }
        m.finish(&mut out);
        (out, None)
    }

    #[test]
    fn split_stop_strings_are_found_and_never_emitted() {
        assert_eq!(
            run(&["STOP"], &["ab", "cS", "TO", "Pxyz"]),
            ("abc".into(), Some(0))
        );
        assert_eq!(
            run(&["STOP"], &["ab", "cS", "TO", "x"]),
            ("abcSTOx".into(), None)
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), Some(0)));
        // The first completed wins, whatever the split.
        assert_eq!(run(&["abcd", "bc"], &["abcd"]), ("a".into(), Some(1)));
        assert_eq!(run(&["abcd", "bc"], &["ab", "cd"]), ("a".into(), Some(1)));
        assert_eq!(run(&["é!"], &["caf", "é", "!"]), ("caf".into(), Some(0)));
        assert_eq!(run(&[] as &[&str], &["a", "b"]), ("ab".into(), None));
    }

    #[test]
    fn held_text_is_only_a_possible_start() {
        let mut m = StopMatcher::new(&["</s>", "##"]).unwrap();
        let mut out = String::new();
        assert_eq!(m.push("hello </", &mut out), None);
        assert_eq!((out.as_str(), m.held()), ("hello ", "</"));
        assert_eq!(m.push("b> #", &mut out), None);
        assert_eq!((out.as_str(), m.held()), ("hello </b> ", "#"));
        assert!(StopMatcher::new(&[""]).is_err());
    }

    #[test]
    fn disarmed_matcher_lets_stops_through_but_keeps_a_possible_start() {
        let mut m = StopMatcher::new(&["ab"]).unwrap();
        let mut out = String::new();
        m.set_armed(false);
        assert_eq!(m.push("xab", &mut out), None);
        assert_eq!(m.push("a", &mut out), None);
        assert_eq!(out, "xab");
        m.set_armed(true);
        assert_eq!(m.push("b", &mut out), Some(0));
        assert_eq!(out, "xab");
        assert_eq!(m.matched(), Some("ab"));
    }
}
