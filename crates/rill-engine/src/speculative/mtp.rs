//! The model's own multi-token-prediction block as a draft (Qwen3.5's MTP). The block reads pairs
//! `(h_{p-1}, x_p)`: the model's last hidden state at the position before token `x_p`, and that
//! token. The model's passes over the sequence (the prompt's, each round's verifying pass) log
//! their rows' hidden states ([`Model::set_hidden_log`]); before drafting, the block's own
//! one-layer cache takes in the pairs it lacks up to the pending token, whose output gives the
//! first draft; each further draft pairs the block's own output state with the draft before it.
//! Those chained pairs leave the block's cache after the round: the next round pairs the kept
//! tokens with the model's own states from the verifying pass.

use rill_model::{Batch, HiddenLog, KvCache, Model, Precision};

use crate::session::SEQ;
use crate::EngineError;

/// The MTP block's cache and what it pairs.
pub(super) struct MtpState {
    /// Made for the context when the first generation starts ([`MtpState::ready`]).
    kv: Option<KvCache>,
    /// `x_1..x_m`: the tokens of the pairs the block's cache holds (pair `p` at its position
    /// `p - 1`).
    tokens: Vec<u32>,
    /// The model's last hidden states by position (`d_model` each), and the token at each
    /// position they were computed for (a state is valid while the sequence agrees up to it).
    hidden: Vec<f32>,
    hidden_tokens: Vec<u32>,
    d: usize,
    /// The last pass's logits and output states, and the pairs' input states.
    pub(super) logits: Vec<f32>,
    out: Vec<f32>,
    h_prev: Vec<f32>,
    batch: Batch,
}

impl MtpState {
    pub(super) fn new(d: usize) -> MtpState {
        MtpState {
            kv: None,
            tokens: Vec::new(),
            hidden: Vec::new(),
            hidden_tokens: Vec::new(),
            d,
            logits: Vec::new(),
            out: Vec::new(),
            h_prev: Vec::new(),
            batch: Batch::new(),
        }
    }

    /// Makes the block's cache ready for `capacity` positions (anew when it is smaller or of
    /// other element types).
    pub(super) fn ready(
        &mut self,
        model: &Model,
        capacity: usize,
        precision: Precision,
    ) -> Result<(), EngineError> {
        let types = model.kv_types(precision);
        let fits = (self.kv.as_ref())
            .is_some_and(|kv| kv.capacity_tokens() >= capacity && kv.types() == types);
        if !fits {
            let mut kv = model.new_mtp_kv_cache(capacity, precision)?;
            kv.add_sequence(SEQ)?;
            self.kv = Some(kv);
            self.tokens.clear();
        }
        Ok(())
    }

    pub(super) fn capacity(&self) -> usize {
        self.kv.as_ref().map_or(0, KvCache::capacity_tokens)
    }

    /// Takes in the hidden states a pass of the model logged, for the sequence `tokens` (the
    /// session's, which the rows' positions index).
    pub(super) fn absorb(&mut self, log: HiddenLog, tokens: &[u32]) {
        let d = self.d;
        for (i, &(seq, pos)) in log.rows.iter().enumerate() {
            if seq != SEQ || pos >= tokens.len() {
                continue;
            }
            if self.hidden_tokens.len() <= pos {
                self.hidden_tokens.resize(pos + 1, u32::MAX);
                self.hidden.resize((pos + 1) * d, 0.0);
            }
            self.hidden_tokens[pos] = tokens[pos];
            self.hidden[pos * d..(pos + 1) * d].copy_from_slice(&log.data[i * d..(i + 1) * d]);
        }
    }

    /// Positions of `seq` whose hidden states are known (the leading run agreeing with it).
    pub(super) fn known(&self, seq: &[u32]) -> usize {
        self.hidden_tokens
            .iter()
            .zip(seq)
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// Brings the block's cache to the pairs of `seq` (the cached tokens and the pending one;
    /// the model's states known for all but the pending one) and runs the last pair's pass:
    /// `logits` then hold the first draft's. Returns the passes run (0: nothing to draft from).
    pub(super) fn catch_up(
        &mut self,
        model: &mut Model,
        precision: Precision,
        seq: &[u32],
    ) -> Result<usize, EngineError> {
        let n = seq.len() - 1;
        let known = self.known(seq);
        let Some(kv) = self.kv.as_mut() else {
            return Ok(0);
        };
        if n == 0 || known < n || n > kv.capacity_tokens() {
            return Ok(0);
        }
        // Pairs 1..=n; those the cache holds stay while their tokens agree (their states are
        // the model's for the same prefix), less one so the last pair's logits are computed.
        let common = self
            .tokens
            .iter()
            .zip(&seq[1..])
            .take_while(|(a, b)| a == b)
            .count()
            .min(n - 1);
        let kept = kv.truncate(SEQ, common)?;
        self.tokens.truncate(kept);
        let d = self.d;
        self.batch.rows.clear();
        self.h_prev.clear();
        for (p, &token) in seq.iter().enumerate().take(n + 1).skip(kept + 1) {
            self.batch.push(SEQ, token, p - 1, p == n);
            self.h_prev
                .extend_from_slice(&self.hidden[(p - 1) * d..p * d]);
        }
        model.forward_mtp(
            &self.batch,
            &self.h_prev,
            kv,
            precision,
            &mut self.logits,
            &mut self.out,
        )?;
        self.tokens.extend_from_slice(&seq[kept + 1..=n]);
        // The last pair's output state, for the next draft.
        let rows = self.batch.len();
        self.out.drain(..(rows - 1) * d);
        Ok(1)
    }

    /// The pass after draft `x`: the pair of the block's last output state and `x`; `logits`
    /// then hold the next draft's.
    pub(super) fn step(
        &mut self,
        model: &mut Model,
        precision: Precision,
        x: u32,
    ) -> Result<(), EngineError> {
        let Some(kv) = self.kv.as_mut() else {
            return Ok(());
        };
        let pos = kv.seq_len(SEQ)?;
        self.batch.rows.clear();
        self.batch.push(SEQ, x, pos, true);
        self.h_prev.clear();
        self.h_prev.extend_from_slice(&self.out[..self.d]);
        model.forward_mtp(
            &self.batch,
            &self.h_prev,
            kv,
            precision,
            &mut self.logits,
            &mut self.out,
        )?;
        Ok(())
    }

    /// Drops the chained drafts' pairs: the cache holds the pairs of the model's own states.
    pub(super) fn end_round(&mut self) -> Result<(), EngineError> {
        if let Some(kv) = self.kv.as_mut() {
            let kept = kv.truncate(SEQ, self.tokens.len())?;
            self.tokens.truncate(kept);
        }
        Ok(())
    }

    /// Computes the model's hidden states of `prompt`'s positions it does not know (a prompt
    /// the session found cached from another generation), in a cache of their own. Returns
    /// the passes run.
    pub(super) fn fill_prompt(
        &mut self,
        model: &mut Model,
        precision: Precision,
        prompt: &[u32],
    ) -> Result<usize, EngineError> {
        if self.known(prompt) >= prompt.len() || prompt.len() > self.capacity() {
            return Ok(0);
        }
        let mut kv = model.new_kv_cache(prompt.len(), precision)?;
        kv.add_sequence(SEQ)?;
        let mut passes = 0;
        let mut logits = Vec::new();
        for (batch, _) in crate::session::prompt_passes(prompt, 0) {
            model.set_hidden_log(true);
            let result = model.forward(&batch, &mut kv, precision, &mut logits);
            let log = model.take_hidden_log();
            model.set_hidden_log(false);
            result?;
            self.absorb(log, prompt);
            passes += 1;
        }
        Ok(passes)
    }
}
