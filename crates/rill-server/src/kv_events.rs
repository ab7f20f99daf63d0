//! The KV-event publisher: every change to the prefix cache, sent over ZeroMQ in vLLM's wire
//! format, which llm-d's router and NVIDIA Dynamo consume to route each request to the replica
//! that already holds its prefix.
//!
//! A PUB socket sends one message per engine step that changed the cache, of three frames: the
//! topic (`kv@<replica>@<model>` by default), a sequence number (8 bytes, big-endian, from 0;
//! batches the engine dropped because this publisher fell behind leave a gap)
//! and a MessagePack payload `[timestamp, [event, ...], data_parallel_rank]`. Each event is an
//! array with its tag first, as msgspec encodes vLLM's tagged structs:
//! - `["BlockStored", [hash, ...], parent_hash | nil, [token, ...], block_size, lora_id (nil),
//!   medium (nil)]`;
//! - `["BlockRemoved", [hash, ...], medium (nil)]`;
//! - `["AllBlocksCleared"]`.
//!
//! Hashes are rill's 64-bit chained block hashes, as unsigned integers; a parent is nil for a
//! block at the start of a prompt. The replay socket vLLM can also offer is not provided: a
//! subscriber that misses messages (a gap in the sequence numbers) starts again from what
//! follows.

use rill_engine::serve::KvEventBatch;
use rill_model::KvEvent;
use zeromq::{Socket, SocketSend, ZmqMessage};

/// Why the publisher could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot publish KV events on {endpoint}: {message}")]
pub struct KvEventsError {
    pub endpoint: String,
    pub message: String,
}

/// A bound PUB socket.
pub struct KvEventPublisher {
    socket: zeromq::PubSocket,
    topic: String,
    endpoint: String,
}

impl KvEventPublisher {
    /// Binds a PUB socket at `endpoint` (`tcp://HOST:PORT`, `*` for every address).
    pub async fn bind(endpoint: &str, topic: String) -> Result<KvEventPublisher, KvEventsError> {
        let mut socket = zeromq::PubSocket::new();
        let bound = socket.bind(endpoint).await.map_err(|e| KvEventsError {
            endpoint: endpoint.to_string(),
            message: e.to_string(),
        })?;
        Ok(KvEventPublisher {
            socket,
            topic,
            endpoint: bound.to_string(),
        })
    }

    /// Where the socket is bound (with the port chosen, if it asked for port 0).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Sends every batch from `events` until the engine loop ends.
    pub async fn run(mut self, mut events: tokio::sync::mpsc::Receiver<KvEventBatch>) {
        while let Some(batch) = events.recv().await {
            let frames = vec![
                bytes::Bytes::from(self.topic.clone().into_bytes()),
                // The engine's count: batches it dropped for a slow publisher leave a gap.
                bytes::Bytes::copy_from_slice(&batch.seq.to_be_bytes()),
                bytes::Bytes::from(encode_batch(&batch)),
            ];
            let Ok(message) = ZmqMessage::try_from(frames) else {
                continue;
            };
            // A PUB socket drops what no subscriber takes; an error here is a closed socket.
            if self.socket.send(message).await.is_err() {
                break;
            }
        }
    }
}

/// The batch as vLLM's `KVEventBatch` in MessagePack: `[ts, [events], 0]`.
pub fn encode_batch(batch: &KvEventBatch) -> Vec<u8> {
    use rmp::encode::*;
    let mut out = Vec::with_capacity(64 + batch.events.len() * 32);
    // Writing to a Vec cannot fail.
    let _ = write_array_len(&mut out, 3);
    let _ = write_f64(&mut out, batch.timestamp);
    let _ = write_array_len(&mut out, batch.events.len() as u32);
    for event in &batch.events {
        encode_event(&mut out, event);
    }
    let _ = write_uint(&mut out, 0);
    out
}

fn encode_event(out: &mut Vec<u8>, event: &KvEvent) {
    use rmp::encode::*;
    let hashes = |out: &mut Vec<u8>, hashes: &[u64]| {
        let _ = write_array_len(out, hashes.len() as u32);
        for &h in hashes {
            let _ = write_u64(out, h);
        }
    };
    match event {
        KvEvent::Stored {
            hashes: h,
            parent,
            tokens,
            block_size,
        } => {
            let _ = write_array_len(out, 7);
            let _ = write_str(out, "BlockStored");
            hashes(out, h);
            match parent {
                Some(p) => {
                    let _ = write_u64(out, *p);
                }
                None => {
                    let _ = write_nil(out);
                }
            }
            let _ = write_array_len(out, tokens.len() as u32);
            for &t in tokens {
                let _ = write_uint(out, u64::from(t));
            }
            let _ = write_uint(out, *block_size as u64);
            let _ = write_nil(out); // lora_id
            let _ = write_nil(out); // medium: the primary cache
        }
        KvEvent::Removed { hashes: h } => {
            let _ = write_array_len(out, 3);
            let _ = write_str(out, "BlockRemoved");
            hashes(out, h);
            let _ = write_nil(out); // medium
        }
        KvEvent::AllCleared => {
            let _ = write_array_len(out, 1);
            let _ = write_str(out, "AllBlocksCleared");
        }
    }
}
