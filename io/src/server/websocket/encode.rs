//! What the server writes: unmasked, unfragmented frames, and the answers a peer's control
//! frames call for.

use super::{Step, OPCODE_CLOSE, OPCODE_PONG};

/// Encodes one unfragmented, unmasked frame (servers never mask, section 5.1), with the
/// shortest length form.
pub fn encode_frame(out: &mut Vec<u8>, opcode: u8, payload: &[u8]) {
    out.reserve(payload.len() + 10);
    out.push(0x80 | opcode);
    match payload.len() {
        n if n < 126 => out.push(n as u8),
        n if n <= usize::from(u16::MAX) => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
}

/// Appends what `step` must be answered with on the wire: a pong with the ping's payload, or
/// the reply to a close frame (its code echoed, or an empty close if it had none). Nothing for
/// any other step.
pub fn encode_answer(out: &mut Vec<u8>, step: &Step<'_>) {
    match step {
        Step::Ping(payload) => encode_frame(out, OPCODE_PONG, payload),
        Step::Close(Some(code)) => encode_frame(out, OPCODE_CLOSE, &code.to_be_bytes()),
        Step::Close(None) => encode_frame(out, OPCODE_CLOSE, &[]),
        _ => {}
    }
}
