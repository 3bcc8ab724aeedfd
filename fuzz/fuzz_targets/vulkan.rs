//! Any bytes as a Vulkan delegate payload: when they decode, every rendering is produced and
//! every constant with a layout (float, half or a 4-bit weight) is dequantized whole and in a
//! window, which must agree bit for bit, from stored bytes and scales taken from the input.
//!
//! Run from `fuzz/` with the real payloads as seeds (the `processed.bin` of each Vulkan
//! delegate of the `vk_*` fixtures, e.g. through `ptefs cat`), then
//! `cargo +nightly fuzz run vulkan corpus/vulkan -- -max_total_time=600`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ptefs::backend::vulkan::render::{graph_json, graph_txt, header_json, value_json_in};
use ptefs::backend::vulkan::{decode, QuantLayout};

/// The bytes of `data`, repeated to `len`.
fn cycled(data: &[u8], len: usize) -> Vec<u8> {
    if data.is_empty() {
        return vec![0; len];
    }
    data.iter().copied().cycle().take(len).collect()
}

fn exercise_layout(layout: &QuantLayout, data: &[u8], window: u64) {
    if layout.numel() > 1 << 16 || layout.data_nbytes() > 1 << 20 || layout.scale_nbytes() > 1 << 20
    {
        return;
    }
    let n = layout.numel() as usize;
    let stored = cycled(data, layout.data_nbytes() as usize);
    let scales = cycled(
        data.get(1..).unwrap_or_default(),
        layout.scale_nbytes() as usize,
    );
    let mut values = vec![0f32; n];
    layout.dequantize(&stored, &scales, 0, &mut values).unwrap();
    let start = window.min(n as u64);
    let mut part = vec![0f32; (n - start as usize).min(97)];
    layout
        .dequantize(&stored, &scales, start, &mut part)
        .unwrap();
    for (a, b) in part.iter().zip(&values[start as usize..]) {
        assert!(a.to_bits() == b.to_bits());
    }
    // Past the end, and too few bytes, are refused rather than read.
    assert!(layout
        .dequantize(&stored, &scales, n as u64, &mut [0f32; 1])
        .is_err());
    if layout.data_nbytes() > 0 {
        assert!(layout
            .dequantize(&stored[1..], &scales, 0, &mut [])
            .is_err());
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(graph) = decode(data) {
        let _ = header_json(&graph);
        let _ = graph_json(&graph, data);
        assert!(graph_txt(&graph).lines().count() == graph.chain.len());
        let _ = graph.named_uses();
        for v in &graph.values {
            let json = value_json_in(&graph, v, &|_| None);
            assert_eq!(json["id"], v.id);
            if let Some(t) = v.tensor() {
                let _ = t.expected_nbytes();
            }
            if let Ok(layout) = QuantLayout::for_value(&graph, v) {
                exercise_layout(&layout, data, u64::from(v.id));
            }
        }
    }
});
