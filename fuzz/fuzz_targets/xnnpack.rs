//! Any bytes as an XNNPACK delegate payload: when they decode, every rendering is produced
//! and every constant's layout dequantized and re-quantized. The first byte also picks a
//! quantized layout whose shape, stored bytes, scales and values come from the rest of the
//! input, so the quantizers see inputs no real payload has.
//!
//! Run from `fuzz/` with the real payloads as seeds (the `processed.bin` of each XNNPACK
//! delegate, e.g. through `ptefs cat`), then
//! `cargo +nightly fuzz run xnnpack corpus/xnnpack -- -max_total_time=600`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ptefs::backend::xnnpack::quant::QuantLayout;
use ptefs::backend::xnnpack::render::{graph_json, graph_txt, header_json, value_json};
use ptefs::backend::xnnpack::{
    decode, BlobRef, Datatype, QuantParams, ScaleDtype, ScaleRef, XnnValue,
};

/// The bytes of `data`, repeated to `len`.
fn cycled(data: &[u8], len: usize) -> Vec<u8> {
    if data.is_empty() {
        return vec![0; len];
    }
    data.iter().copied().cycle().take(len).collect()
}

/// Dequantizes stored bytes taken from the input, then re-quantizes the result both ways.
fn exercise_layout(layout: &QuantLayout, data: &[u8], window: u64) {
    if layout.numel() > 1 << 16 || layout.scale_nbytes() > 1 << 20 {
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
        assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
    }
    let mut again = vec![0u8; stored.len()];
    let mut fresh_scales = vec![0u8; scales.len()];
    let fresh = layout.requantize(&values, &mut again, &mut fresh_scales);
    if values.iter().all(|v| v.is_finite()) && fresh.is_ok() {
        let mut back = vec![0f32; n];
        layout
            .dequantize(&again, &fresh_scales, 0, &mut back)
            .unwrap();
        assert!(back.iter().all(|v| v.is_finite()));
        // A commit streams the array in windows: the same bytes as the whole.
        let count = layout.scale_values(&fresh_scales).unwrap().len();
        let mut largest = vec![0u32; count];
        for (k, w) in values.chunks(5).enumerate() {
            layout.largest_in_window(5 * k as u64, w, &mut largest).unwrap();
        }
        let mut windowed_scales = vec![0u8; fresh_scales.len()];
        layout.store_fresh_scales(&largest, &mut windowed_scales).unwrap();
        let mut windowed = layout.blank_data();
        for (k, w) in values.chunks(5).enumerate() {
            layout
                .encode_window(5 * k as u64, w, &mut windowed, &windowed_scales)
                .unwrap();
        }
        assert_eq!((windowed, windowed_scales), (again.clone(), fresh_scales.clone()));
    }
    let _ = layout.requantize_with_scales(&values, &mut again, &scales);
    // What a write that rescales an int32 bias does with the scales it reads and stores.
    if let Ok(read) = layout.scale_values(&scales) {
        let ratios: Vec<f64> = read.iter().map(|&s| f64::from(s)).collect();
        let mut rescaled = vec![0u8; stored.len()];
        let _ = layout.rescale_int32(&stored, &ratios, &mut rescaled);
        let _ = layout.store_scale_values(&read, &mut fresh_scales);
    }
}

fn synthetic(selector: u8, data: &[u8]) -> Option<XnnValue> {
    let byte = |i: usize| data.get(i).copied().unwrap_or(1);
    let rows = u32::from(byte(0) % 9 + 1);
    let cols = u32::from(byte(1) % 17 + 1);
    let scales = |dtype: ScaleDtype, count: u64| {
        Some(ScaleRef {
            bytes: BlobRef::Payload {
                offset: 0,
                size: count * dtype.size(),
            },
            dtype,
            count,
            inline: false,
        })
    };
    let (datatype, dims, quant) = match selector % 6 {
        0 => {
            let group = 2 * u32::from(byte(2) % 4 + 1);
            let count = u64::from(rows * 2);
            let dt = if byte(3) % 2 == 0 {
                ScaleDtype::Bf16
            } else {
                ScaleDtype::F32RoundedToBf16
            };
            (
                Datatype::QBINT4,
                vec![rows, group * 2],
                QuantParams::PerChannelGroup {
                    scale: None,
                    channel_dim: 0,
                    group_size: group as i32,
                    scale_buffer_idx: 1,
                    num_scales: count as u32,
                    scales: scales(dt, count),
                },
            )
        }
        1 | 2 => {
            let channel_dim = i32::from(byte(2) % 2);
            let channels = if channel_dim == 0 { rows } else { cols };
            let dt = if selector % 6 == 1 {
                Datatype::QCINT4
            } else {
                Datatype::QCINT8
            };
            (
                dt,
                vec![rows, cols],
                QuantParams::PerChannel {
                    scale: None,
                    channel_dim,
                    scale_buffer_idx: 1,
                    num_scales: channels,
                    scales: scales(ScaleDtype::F32, u64::from(channels)),
                },
            )
        }
        3 => (
            Datatype::QCINT32,
            vec![rows],
            QuantParams::PerChannel {
                scale: None,
                channel_dim: 0,
                scale_buffer_idx: 1,
                num_scales: rows,
                scales: scales(ScaleDtype::F32, u64::from(rows)),
            },
        ),
        4 => {
            let zero_point = i32::from(byte(2) as i8);
            (
                Datatype::QINT8,
                vec![rows, cols],
                QuantParams::PerTensor {
                    scale: f32::from(byte(3)) / 64.0 + 0.001,
                    zero_point,
                    scale_field: Some(BlobRef::Payload { offset: 0, size: 4 }),
                },
            )
        }
        _ => {
            let dt = [Datatype::FP16, Datatype::BF16, Datatype::FP32][usize::from(byte(2) % 3)];
            return Some(XnnValue {
                quantized: false,
                quant: None,
                ..value(dt, vec![rows, cols])
            });
        }
    };
    Some(XnnValue {
        quant: Some(quant),
        ..value(datatype, dims)
    })
}

fn value(datatype: Datatype, dims: Vec<u32>) -> XnnValue {
    XnnValue {
        id: 0,
        index: 0,
        quantized: true,
        datatype,
        num_dims: dims.len() as u32,
        dims,
        constant_buffer_idx: 1,
        external_id: u32::MAX,
        flags: 0,
        dq_datatype: Datatype::INVALID,
        quant: None,
        constant: None,
        used_by: Vec::new(),
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(graph) = decode(data) {
        let _ = header_json(&graph);
        let _ = graph_json(&graph, data);
        assert!(graph_txt(&graph).lines().count() == graph.nodes.len());
        for v in &graph.values {
            let json = value_json(v, &|_| None);
            assert_eq!(json["id"], v.id);
            let _ = v.expected_nbytes();
            if let Ok(layout) = QuantLayout::for_value(v) {
                exercise_layout(&layout, data, u64::from(v.id));
            }
        }
    }
    if let Some((&selector, rest)) = data.split_first() {
        if let Some(v) = synthetic(selector, rest) {
            if let Ok(layout) = QuantLayout::for_value(&v) {
                exercise_layout(&layout, rest, u64::from(selector));
            }
        }
    }
});
