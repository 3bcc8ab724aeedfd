//! Dequantizing and re-quantizing a 4096×4096 filter (`qbint4` group 32, `qcint4`, `qcint8`),
//! in GB/s of float32 produced or consumed, against `copy_from_slice` of the same number of
//! float32 bytes measured in the same run (docs/performance.md#targets: at least 1 GB/s per
//! core).
//!
//! `cargo bench --bench quant` (single-threaded; each figure is the best of several runs).

use std::hint::black_box;
use std::time::{Duration, Instant};

use ptefs::backend::xnnpack::quant::QuantLayout;
use ptefs::backend::xnnpack::{BlobRef, Datatype, QuantParams, ScaleDtype, ScaleRef, XnnValue};

const ROWS: u32 = 4096;
const COLS: u32 = 4096;
const RUNS: usize = 7;
/// What a FUSE read of a `.f32.npy` asks for at a time.
const WINDOW: usize = 1 << 18;

fn scales(dtype: ScaleDtype, count: u64) -> Option<ScaleRef> {
    Some(ScaleRef {
        bytes: BlobRef::Named {
            key: "scales".into(),
            size: count * dtype.size(),
        },
        dtype,
        count,
        inline: false,
    })
}

fn filter(datatype: Datatype, quant: QuantParams) -> XnnValue {
    XnnValue {
        id: 0,
        index: 0,
        quantized: true,
        datatype,
        num_dims: 2,
        dims: vec![ROWS, COLS],
        constant_buffer_idx: 1,
        external_id: u32::MAX,
        flags: 0,
        dq_datatype: Datatype::INVALID,
        quant: Some(quant),
        constant: Some(BlobRef::Named {
            key: "weights".into(),
            size: 0,
        }),
        used_by: Vec::new(),
    }
}

/// Best wall time of `RUNS` calls.
fn best(mut f: impl FnMut()) -> Duration {
    (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn gbps(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn main() {
    let n = (ROWS * COLS) as usize;
    let f32_bytes = n * 4;
    let source: Vec<f32> = (0..n)
        .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 997.0)
        .collect();
    let mut sink = vec![0f32; n];
    let copy = best(|| {
        sink.copy_from_slice(black_box(&source));
        black_box(&sink);
    });
    let copy_gbps = gbps(f32_bytes, copy);
    println!(
        "copy_from_slice of {} MiB of float32: {copy_gbps:.2} GB/s",
        f32_bytes >> 20
    );

    let group = 32u64;
    let cases = [
        (
            "qbint4 group 32",
            filter(
                Datatype::QBINT4,
                QuantParams::PerChannelGroup {
                    scale: None,
                    channel_dim: 0,
                    group_size: group as i32,
                    scale_buffer_idx: 2,
                    num_scales: (u64::from(ROWS) * u64::from(COLS) / group) as u32,
                    scales: scales(ScaleDtype::Bf16, u64::from(ROWS) * u64::from(COLS) / group),
                },
            ),
        ),
        ("qcint4", per_channel(Datatype::QCINT4)),
        ("qcint8", per_channel(Datatype::QCINT8)),
    ];
    println!(
        "{:<16} {:>22} {:>22} {:>22}",
        "", "dequantize", "dequantize 1 MiB reads", "requantize"
    );
    for (name, value) in cases {
        let layout = QuantLayout::for_value(&value).expect("a valid layout");
        let mut data = vec![0u8; layout.data_nbytes() as usize];
        let mut scale_bytes = vec![0u8; layout.scale_nbytes() as usize];
        layout
            .requantize(&source, &mut data, &mut scale_bytes)
            .expect("finite input");

        let whole = best(|| {
            layout
                .dequantize(black_box(&data), &scale_bytes, 0, &mut sink)
                .unwrap();
            black_box(&sink);
        });
        let windows = best(|| {
            for (k, w) in sink.chunks_mut(WINDOW).enumerate() {
                layout
                    .dequantize(black_box(&data), &scale_bytes, (k * WINDOW) as u64, w)
                    .unwrap();
            }
            black_box(&sink);
        });
        let requant = best(|| {
            layout
                .requantize(black_box(&source), &mut data, &mut scale_bytes)
                .unwrap();
            black_box(&data);
        });
        let cell = |t: Duration| {
            let g = gbps(f32_bytes, t);
            format!("{g:6.2} GB/s ({:.2}x)", g / copy_gbps)
        };
        println!(
            "{name:<16} {:>22} {:>22} {:>22}",
            cell(whole),
            cell(windows),
            cell(requant)
        );
    }
}

fn per_channel(datatype: Datatype) -> XnnValue {
    filter(
        datatype,
        QuantParams::PerChannel {
            scale: None,
            channel_dim: 0,
            scale_buffer_idx: 2,
            num_scales: ROWS,
            scales: scales(ScaleDtype::F32, u64::from(ROWS)),
        },
    )
}
