//! Embeddings: texts through the model, the final-norm hidden states of their positions
//! pooled into one vector each and normalised to unit length, as llama.cpp's embedding mode
//! does. Several inputs go through one forward pass (rows of several sequences), in a KV cache
//! of the pass's own.

use rill_model::Batch;

use crate::{Engine, EngineError};

/// How a text's hidden states become one vector (GGUF `{arch}.pooling_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over every position.
    Mean,
    /// The first position's (a BERT-style `[CLS]` token).
    Cls,
    /// The last position's (Qwen3-Embedding and other decoder embedders).
    Last,
}

impl Pooling {
    /// The name the API reports.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

/// The first `n` dimensions of a unit vector, normalised again (what Matryoshka-trained models
/// allow; all zeros stay zeros).
pub fn leading_dimensions(v: &[f32], n: usize) -> Vec<f32> {
    let cut = &v[..n.min(v.len())];
    let norm = cut.iter().map(|x| x * x).sum::<f32>().sqrt();
    cut.iter()
        .map(|x| if norm > 0.0 { x / norm } else { 0.0 })
        .collect()
}

/// The embeddings of some texts.
#[derive(Debug, Clone)]
pub struct Embeddings {
    /// One unit vector per input, in order.
    pub vectors: Vec<Vec<f32>>,
    /// Forward passes run.
    pub passes: usize,
}

impl Engine {
    /// The model's pooling: its GGUF's `{arch}.pooling_type` (1 mean, 2 CLS, 3 last), else mean
    /// (a generative model has none; the mean of its positions is the common choice).
    pub fn pooling(&self) -> Pooling {
        let meta = self.model.file().metadata();
        let arch = meta
            .get_str("general.architecture")
            .ok()
            .flatten()
            .unwrap_or("");
        match meta.get_u64(&format!("{arch}.pooling_type")).ok().flatten() {
            Some(2) => Pooling::Cls,
            Some(3) => Pooling::Last,
            _ => Pooling::Mean,
        }
    }

    /// Embeds each of `inputs` (token ids): their rows go through in passes of at most
    /// `max_rows` rows (several inputs per pass, an input cut across passes when it must be;
    /// an encoder's never: it sees a whole input at once, so a longer input takes a pass of its
    /// own), their final-norm hidden states pooled by `pooling` and normalised to unit length.
    pub fn embed(
        &mut self,
        inputs: &[Vec<u32>],
        pooling: Pooling,
        max_rows: usize,
    ) -> Result<Embeddings, EngineError> {
        let context = self.model.config().context_length;
        let vocab = self.model.config().vocab_size;
        for input in inputs {
            if input.is_empty() {
                return Err(EngineError::EmptyPrompt);
            }
            if input.len() > context {
                return Err(EngineError::PromptTooLong {
                    prompt: input.len(),
                    context,
                });
            }
            if let Some(&token) = input.iter().find(|&&t| t as usize >= vocab) {
                return Err(EngineError::TokenOutOfVocab {
                    what: "input",
                    token,
                    vocab_size: vocab,
                });
            }
        }
        let max_rows = max_rows.max(1);
        let d = self.model.config().d_model;
        let mut sums = vec![vec![0f64; d]; inputs.len()];
        let mut passes = 0;
        // Groups of whole inputs share a KV cache of their own (bounded: a recurrent model holds
        // at most so many sequences' states, and the cache at most a few passes of rows); the
        // rows of a group go through in passes of `max_rows`, inputs cut across passes.
        let max_seqs = if self
            .model
            .config()
            .layer_kinds
            .iter()
            .all(|k| *k == rill_model::LayerKind::Attention)
        {
            256
        } else {
            rill_model::KvCache::DEFAULT_STATE_SEQUENCES
        };
        let row_budget = max_rows.saturating_mul(8);
        let mut start = 0;
        while start < inputs.len() {
            let mut end = start + 1;
            let mut rows = inputs[start].len();
            while end < inputs.len()
                && end - start < max_seqs
                && rows + inputs[end].len() <= row_budget
            {
                rows += inputs[end].len();
                end += 1;
            }
            passes += self.embed_group(&inputs[start..end], start, pooling, max_rows, &mut sums)?;
            start = end;
        }
        let vectors = sums
            .into_iter()
            .zip(inputs)
            .map(|(sum, input)| {
                let scale = match pooling {
                    Pooling::Mean => 1.0 / input.len() as f64,
                    Pooling::Cls | Pooling::Last => 1.0,
                };
                let v: Vec<f64> = sum.iter().map(|x| x * scale).collect();
                let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
                let inv = if norm > 0.0 { 1.0 / norm } else { 0.0 };
                v.iter().map(|x| (x * inv) as f32).collect()
            })
            .collect();
        Ok(Embeddings { vectors, passes })
    }

    /// One group's passes: every input a sequence of a KV cache sized for the group.
    fn embed_group(
        &mut self,
        group: &[Vec<u32>],
        first: usize,
        pooling: Pooling,
        max_rows: usize,
        sums: &mut [Vec<f64>],
    ) -> Result<usize, EngineError> {
        // Each sequence takes whole blocks.
        let block = rill_model::KvCache::DEFAULT_BLOCK_SIZE;
        let total: usize = group.iter().map(|i| i.len().div_ceil(block) * block).sum();
        let mut kv = crate::session::session_kv_cache(&self.model, total, self.precision)?;
        for (i, input) in group.iter().enumerate() {
            kv.add_sequence_for(i as u64, input.len())?;
        }
        // Rows in input order; a pass takes at most `max_rows` of them.
        let all: Vec<(u64, u32, usize)> = group
            .iter()
            .enumerate()
            .flat_map(|(i, input)| {
                input
                    .iter()
                    .enumerate()
                    .map(move |(pos, &t)| (i as u64, t, pos))
            })
            .collect();
        let d = self.model.config().d_model;
        let mut logits = Vec::new();
        let mut passes = 0;
        // A bidirectional model (an encoder) sees a whole input at once: its passes take whole
        // inputs, as many as fit in `max_rows` (one longer input alone).
        let mut chunks: Vec<&[(u64, u32, usize)]> = Vec::new();
        if self.model.config().bidirectional {
            let mut start = 0;
            while start < all.len() {
                let mut end = start;
                while end < all.len() {
                    let len = group[all[end].0 as usize].len();
                    if end > start && end - start + len > max_rows {
                        break;
                    }
                    end += len;
                }
                chunks.push(&all[start..end]);
                start = end;
            }
        } else {
            chunks.extend(all.chunks(max_rows));
        }
        self.model.set_hidden_log(true);
        let result = (|| {
            for chunk in chunks {
                let mut batch = Batch::new();
                for &(seq, token, pos) in chunk {
                    batch.push(seq, token, pos, false);
                }
                self.model
                    .forward(&batch, &mut kv, self.precision, &mut logits)?;
                passes += 1;
                let log = self.model.take_hidden_log();
                for (r, &(seq, pos)) in log.rows.iter().enumerate() {
                    let i = seq as usize;
                    let len = group[i].len();
                    let wanted = match pooling {
                        Pooling::Mean => true,
                        Pooling::Cls => pos == 0,
                        Pooling::Last => pos + 1 == len,
                    };
                    if wanted {
                        let h = &log.data[r * d..(r + 1) * d];
                        for (s, &x) in sums[first + i].iter_mut().zip(h) {
                            *s += f64::from(x);
                        }
                    }
                }
            }
            Ok::<_, EngineError>(())
        })();
        self.model.set_hidden_log(false);
        result?;
        Ok(passes)
    }
}
