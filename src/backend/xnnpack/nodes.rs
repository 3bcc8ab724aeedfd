//! The fields of each `XNodeUnion` member, by schema name and in schema order.
//!
//! The union has 47 members over 15 table types. Each member is read through the generated
//! accessor for its own type, so a table is only ever read as the type the verifier checked
//! it as. Fields ending in `_id` name values: the output fields (`output_id`,
//! `output_value_id`, `output_index_id`) are written by the node, the others read; a
//! concatenation of N inputs carries five input slots and reads only the first N.

use crate::format::generated::xnn_fb;

/// `XNN_INVALID_VALUE_ID`: an optional input that is absent (a linear without bias).
pub const NO_VALUE: u32 = u32::MAX;

#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    /// A value id the node reads (`NO_VALUE` when an optional input is absent).
    Input(u32),
    /// A value id the node writes.
    Output(u32),
    /// A value id slot the op does not read (the spare inputs of a short concatenation).
    Unused(u32),
    Uint(u32),
    Float(f32),
    /// An absent vector is `None`.
    UintList(Option<Vec<u32>>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct NodeField {
    /// The schema's field name (`"filter_id"`, `"kernel_height"`).
    pub name: &'static str,
    pub value: FieldValue,
}

impl NodeField {
    /// The field name without `_id`: how `used_by` names a value's role (`"filter"`).
    pub fn role(&self) -> &'static str {
        self.name.strip_suffix("_id").unwrap_or(self.name)
    }
}

/// Collects fields in schema order.
struct Fields(Vec<NodeField>);

impl Fields {
    fn new() -> Self {
        Fields(Vec::with_capacity(8))
    }
    fn push(&mut self, name: &'static str, value: FieldValue) -> &mut Self {
        self.0.push(NodeField { name, value });
        self
    }
    fn input(&mut self, name: &'static str, id: u32) -> &mut Self {
        self.push(name, FieldValue::Input(id))
    }
    fn output(&mut self, name: &'static str, id: u32) -> &mut Self {
        self.push(name, FieldValue::Output(id))
    }
    fn uint(&mut self, name: &'static str, v: u32) -> &mut Self {
        self.push(name, FieldValue::Uint(v))
    }
    fn float(&mut self, name: &'static str, v: f32) -> &mut Self {
        self.push(name, FieldValue::Float(v))
    }
    fn list(&mut self, name: &'static str, v: Option<flatbuffers::Vector<'_, u32>>) -> &mut Self {
        self.push(name, FieldValue::UintList(v.map(|v| v.iter().collect())))
    }
    fn take(&mut self) -> Vec<NodeField> {
        std::mem::take(&mut self.0)
    }
}

fn node_2x1(t: xnn_fb::_XNNNode2x1) -> Vec<NodeField> {
    Fields::new()
        .input("input1_id", t.input1_id())
        .input("input2_id", t.input2_id())
        .output("output_id", t.output_id())
        .uint("flags", t.flags())
        .take()
}

fn node_1x1(t: xnn_fb::_XNNNode1x1) -> Vec<NodeField> {
    Fields::new()
        .input("input_id", t.input_id())
        .output("output_id", t.output_id())
        .uint("flags", t.flags())
        .take()
}

fn fully_connected(t: xnn_fb::XNNFullyConnected) -> Vec<NodeField> {
    Fields::new()
        .input("input1_id", t.input1_id())
        .input("filter_id", t.filter_id())
        .input("bias_id", t.bias_id())
        .output("output_id", t.output_id())
        .uint("flags", t.flags())
        .take()
}

fn static_transpose(t: xnn_fb::XNNStaticTranspose) -> Vec<NodeField> {
    Fields::new()
        .uint("num_dims", t.num_dims())
        .list("perm", t.perm())
        .input("input_id", t.input_id())
        .output("output_id", t.output_id())
        .uint("flags", t.flags())
        .take()
}

fn conv(t: xnn_fb::_XNNNodeConv) -> Vec<NodeField> {
    Fields::new()
        .uint("padding_top", t.padding_top())
        .uint("padding_right", t.padding_right())
        .uint("padding_bottom", t.padding_bottom())
        .uint("padding_left", t.padding_left())
        .uint("kernel_height", t.kernel_height())
        .uint("kernel_width", t.kernel_width())
        .uint("subsampling_height", t.subsampling_height())
        .uint("subsampling_width", t.subsampling_width())
        .uint("dilation_height", t.dilation_height())
        .uint("dilation_width", t.dilation_width())
        .uint("group_input_channels", t.group_input_channels())
        .uint("group_output_channels", t.group_output_channels())
        .uint("groups", t.groups())
        .uint("adjustment_height", t.adjustment_height())
        .uint("adjustment_width", t.adjustment_width())
        .input("input1_id", t.input1_id())
        .input("filter_id", t.filter_id())
        .input("bias_id", t.bias_id())
        .output("output_id", t.output_id())
        .uint("flags", t.flags())
        .take()
}

fn resize_bilinear(t: xnn_fb::XNNStaticResizeBilinear2D) -> Vec<NodeField> {
    Fields::new()
        .uint("new_height", t.new_height())
        .uint("new_width", t.new_width())
        .input("input_id", t.input_id())
        .output("output_id", t.output_id())
        .uint("flags", t.flags())
        .take()
}

fn constant_pad(t: xnn_fb::XNNStaticConstantPad) -> Vec<NodeField> {
    Fields::new()
        .list("pre_paddings", t.pre_paddings())
        .list("post_paddings", t.post_paddings())
        .float("padding_value", t.padding_value())
        .input("input_id", t.input_id())
        .output("output_id", t.output_id())
        .uint("flags", t.flags())
        .take()
}

fn pooling(t: xnn_fb::_XNNPooling2D) -> Vec<NodeField> {
    Fields::new()
        .uint("padding_top", t.padding_top())
        .uint("padding_right", t.padding_right())
        .uint("padding_bottom", t.padding_bottom())
        .uint("padding_left", t.padding_left())
        .uint("pooling_height", t.pooling_height())
        .uint("pooling_width", t.pooling_width())
        .uint("stride_height", t.stride_height())
        .uint("stride_width", t.stride_width())
        .uint("dilation_height", t.dilation_height())
        .uint("dilation_width", t.dilation_width())
        .input("input_id", t.input_id())
        .output("output_id", t.output_id())
        .uint("flags", t.flags())
        .take()
}

fn static_reshape(t: xnn_fb::XNNStaticReshape) -> Vec<NodeField> {
    Fields::new()
        .uint("num_dims", t.num_dims())
        .list("new_shape", t.new_shape())
        .input("input_id", t.input_id())
        .output("output_id", t.output_id())
        .uint("flags", t.flags())
        .take()
}

fn arg_max_pooling(t: xnn_fb::XNNArgMaxPooling2d) -> Vec<NodeField> {
    Fields::new()
        .uint("padding_top", t.padding_top())
        .uint("padding_right", t.padding_right())
        .uint("padding_bottom", t.padding_bottom())
        .uint("padding_left", t.padding_left())
        .uint("pooling_height", t.pooling_height())
        .uint("pooling_width", t.pooling_width())
        .input("input_id", t.input_id())
        .output("output_value_id", t.output_value_id())
        .output("output_index_id", t.output_index_id())
        .uint("flags", t.flags())
        .take()
}

fn leaky_relu(t: xnn_fb::XNNLeakyReLU) -> Vec<NodeField> {
    Fields::new()
        .float("negative_slope", t.negative_slope())
        .input("input_id", t.input_id())
        .output("output_id", t.output_id())
        .uint("flags", t.flags())
        .take()
}

fn elu(t: xnn_fb::XNNELU) -> Vec<NodeField> {
    Fields::new()
        .float("alpha", t.alpha())
        .input("input_id", t.input_id())
        .output("output_id", t.output_id())
        .uint("flags", t.flags())
        .take()
}

/// A concatenation reads `inputs` of its five input slots; the runtime ignores the rest
/// (the exporter fills them with `NO_VALUE`, older payloads may leave 0).
fn concatenate(t: xnn_fb::_XNNCat, inputs: usize) -> Vec<NodeField> {
    let slot = |k: usize, id: u32| {
        if k <= inputs {
            FieldValue::Input(id)
        } else {
            FieldValue::Unused(id)
        }
    };
    Fields::new()
        .uint("axis", t.axis())
        .push("input1_id", slot(1, t.input1_id()))
        .push("input2_id", slot(2, t.input2_id()))
        .push("input3_id", slot(3, t.input3_id()))
        .push("input4_id", slot(4, t.input4_id()))
        .output("output_id", t.output_id())
        .uint("flags", t.flags())
        .push("input5_id", slot(5, t.input5_id()))
        .take()
}

fn static_slice(t: xnn_fb::XNNStaticSlice) -> Vec<NodeField> {
    Fields::new()
        .uint("num_dims", t.num_dims())
        .list("offsets", t.offsets())
        .list("sizes", t.sizes())
        .input("input_id", t.input_id())
        .output("output_id", t.output_id())
        .uint("flags", t.flags())
        .take()
}

fn sdpa(t: xnn_fb::XNNScaledDotProductAttention) -> Vec<NodeField> {
    Fields::new()
        .input("query_id", t.query_id())
        .input("key_id", t.key_id())
        .input("value_id", t.value_id())
        .input("scale_id", t.scale_id())
        .input("mask_id", t.mask_id())
        .output("output_id", t.output_id())
        .uint("flags", t.flags())
        .take()
}

/// What a node's union member holds.
pub enum Member {
    /// Its fields in schema order.
    Fields(Vec<NodeField>),
    /// A member this schema names, but whose table is absent.
    MissingTable,
    /// A union type value this schema does not name (or NONE): its fields are unknown.
    Unknown,
}

/// Reads the fields of a node's union member.
pub fn member_fields(node: &xnn_fb::XNode) -> Member {
    use xnn_fb::XNodeUnion as U;
    macro_rules! members {
        ($($member:ident => $accessor:ident, $shape:expr;)*) => {
            match node.xnode_union_type() {
                $(U::$member => node.$accessor().map($shape),)*
                _ => return Member::Unknown,
            }
        };
    }
    let fields = members! {
        XNNAdd => xnode_union_as_xnnadd, node_2x1;
        XNNFullyConnected => xnode_union_as_xnnfully_connected, fully_connected;
        XNNSoftmax => xnode_union_as_xnnsoftmax, node_1x1;
        XNNSigmoid => xnode_union_as_xnnsigmoid, node_1x1;
        XNNStaticTranspose => xnode_union_as_xnnstatic_transpose, static_transpose;
        XNNClamp => xnode_union_as_xnnclamp, node_1x1;
        XNNConv2d => xnode_union_as_xnnconv_2d, conv;
        XNNDiv => xnode_union_as_xnndiv, node_2x1;
        XNNStaticResizeBilinear2D => xnode_union_as_xnnstatic_resize_bilinear_2_d, resize_bilinear;
        XNNStaticConstantPad => xnode_union_as_xnnstatic_constant_pad, constant_pad;
        XNNAvgPooling2d => xnode_union_as_xnnavg_pooling_2d, pooling;
        XNNMinimum => xnode_union_as_xnnminimum, node_2x1;
        XNNDepthwiseConv2d => xnode_union_as_xnndepthwise_conv_2d, conv;
        XNNMaxPooling2d => xnode_union_as_xnnmax_pooling_2d, pooling;
        XNNMultiply => xnode_union_as_xnnmultiply, node_2x1;
        XNNSubtract => xnode_union_as_xnnsubtract, node_2x1;
        XNNFloor => xnode_union_as_xnnfloor, node_1x1;
        XNNConvert => xnode_union_as_xnnconvert, node_1x1;
        XNNGlobalAvgPooling2d => xnode_union_as_xnnglobal_avg_pooling_2d, node_1x1;
        XNNStaticReshape => xnode_union_as_xnnstatic_reshape, static_reshape;
        XNNArgMaxPooling2d => xnode_union_as_xnnarg_max_pooling_2d, arg_max_pooling;
        XNNSquareRoot => xnode_union_as_xnnsquare_root, node_1x1;
        XNNCeiling => xnode_union_as_xnnceiling, node_1x1;
        XNNHardswish => xnode_union_as_xnnhardswish, node_1x1;
        XNNLeakyReLU => xnode_union_as_xnnleaky_re_lu, leaky_relu;
        XNNMaximum => xnode_union_as_xnnmaximum, node_2x1;
        XNNNegate => xnode_union_as_xnnnegate, node_1x1;
        XNNSquare => xnode_union_as_xnnsquare, node_1x1;
        XNNELU => xnode_union_as_xnnelu, elu;
        XNNAbs => xnode_union_as_xnnabs, node_1x1;
        XNNPReLU => xnode_union_as_xnnpre_lu, node_2x1;
        XNNConcatenate2 => xnode_union_as_xnnconcatenate_2, |t| concatenate(t, 2);
        XNNConcatenate3 => xnode_union_as_xnnconcatenate_3, |t| concatenate(t, 3);
        XNNConcatenate4 => xnode_union_as_xnnconcatenate_4, |t| concatenate(t, 4);
        XNNStaticSlice => xnode_union_as_xnnstatic_slice, static_slice;
        XNNScaledDotProductAttention => xnode_union_as_xnnscaled_dot_product_attention, sdpa;
        XNNBatchMatrixMultiply => xnode_union_as_xnnbatch_matrix_multiply, node_2x1;
        XNNConcatenate5 => xnode_union_as_xnnconcatenate_5, |t| concatenate(t, 5);
        XNNConvTranspose2d => xnode_union_as_xnnconv_transpose_2d, conv;
        XNNReciprocalSquareRoot => xnode_union_as_xnnreciprocal_square_root, node_1x1;
        XNNLog => xnode_union_as_xnnlog, node_1x1;
        XNNGelu => xnode_union_as_xnngelu, node_1x1;
        XNNTanh => xnode_union_as_xnntanh, node_1x1;
        XNNExp => xnode_union_as_xnnexp, node_1x1;
        XNNSin => xnode_union_as_xnnsin, node_1x1;
        XNNCopy => xnode_union_as_xnncopy, node_1x1;
        XNNCos => xnode_union_as_xnncos, node_1x1;
    };
    fields.map_or(Member::MissingTable, Member::Fields)
}
