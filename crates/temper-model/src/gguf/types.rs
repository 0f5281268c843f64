//! ggml tensor element types: ids as stored in GGUF, block geometry, and which ones we can dequantize.

/// A ggml tensor type id as stored in a GGUF tensor info (`enum ggml_type` in ggml.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

impl GgmlType {
    pub const F32: GgmlType = GgmlType(0);
    pub const F16: GgmlType = GgmlType(1);
    pub const Q4_0: GgmlType = GgmlType(2);
    pub const Q4_1: GgmlType = GgmlType(3);
    pub const Q5_0: GgmlType = GgmlType(6);
    pub const Q5_1: GgmlType = GgmlType(7);
    pub const Q8_0: GgmlType = GgmlType(8);
    pub const Q2_K: GgmlType = GgmlType(10);
    pub const Q3_K: GgmlType = GgmlType(11);
    pub const Q4_K: GgmlType = GgmlType(12);
    pub const Q5_K: GgmlType = GgmlType(13);
    pub const Q6_K: GgmlType = GgmlType(14);
    pub const BF16: GgmlType = GgmlType(30);

    /// The types [`super::dequant::dequantize`] handles.
    pub const SUPPORTED: [GgmlType; 13] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
    ];

    /// llama.cpp's name for the type, or `None` for an id ggml does not define.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "F32",
            1 => "F16",
            2 => "Q4_0",
            3 => "Q4_1",
            6 => "Q5_0",
            7 => "Q5_1",
            8 => "Q8_0",
            9 => "Q8_1",
            10 => "Q2_K",
            11 => "Q3_K",
            12 => "Q4_K",
            13 => "Q5_K",
            14 => "Q6_K",
            15 => "Q8_K",
            16 => "IQ2_XXS",
            17 => "IQ2_XS",
            18 => "IQ3_XXS",
            19 => "IQ1_S",
            20 => "IQ4_NL",
            21 => "IQ3_S",
            22 => "IQ2_S",
            23 => "IQ4_XS",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            29 => "IQ1_M",
            30 => "BF16",
            34 => "TQ1_0",
            35 => "TQ2_0",
            39 => "MXFP4",
            _ => return None,
        })
    }

    /// `(elements per block, bytes per block)` for the supported types (ggml's `GGML_QUANT_SIZES`).
    pub fn block_geometry(self) -> Option<(usize, usize)> {
        const QK_K: usize = 256;
        Some(match self.0 {
            0 => (1, 4),
            1 | 30 => (1, 2),
            2 => (32, 2 + 16),
            3 => (32, 2 + 2 + 16),
            6 => (32, 2 + 4 + 16),
            7 => (32, 2 + 2 + 4 + 16),
            8 => (32, 2 + 32),
            10 => (QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
            11 => (QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
            12 => (QK_K, 2 + 2 + QK_K / 2 + 12),
            13 => (QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
            14 => (QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
            _ => return None,
        })
    }

    pub fn is_supported(self) -> bool {
        self.block_geometry().is_some()
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} (type {})", self.0),
            None => write!(f, "unknown type {}", self.0),
        }
    }
}
