//! The one padded layout of token rows (verl's): each row is a prompt, left-padded to the
//! longest prompt `P`, then a continuation, right-padded to the longest continuation `R`, so that
//! continuation token `j` of every row sits at column `P + j`. Prompts alone are the sampler's
//! left-padded prefill; continuations alone are right-padded sequences (Tinker's datums). The
//! trainer's batches, Tinker's forward passes and the engine's prefill are built here.

use tch::{Device, Tensor};

/// Rows of `prompt | continuation`, padded; every field (rows, P + R), row-major.
pub struct PaddedRows {
    pub ids: Vec<i64>,
    /// 1 on real tokens.
    pub mask: Vec<i64>,
    /// A token's index among its row's real tokens; left pads 0, right pads the row's last
    /// (as [`crate::position_ids_from_mask`]).
    pub positions: Vec<i64>,
    pub rows: usize,
    /// `P`.
    pub prompt_width: usize,
    /// `R`.
    pub continuation_width: usize,
}

impl PaddedRows {
    /// `rows` of `(prompt, continuation)` at the widths of the longest of each, padded with
    /// `pad_id`.
    pub fn new(rows: &[(&[i64], &[i64])], pad_id: i64) -> PaddedRows {
        let p = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        let c = rows.iter().map(|r| r.1.len()).max().unwrap_or(0);
        Self::with_widths(rows, p, c, pad_id)
    }

    /// [`PaddedRows::new`] at widths of at least `prompt_width` and `continuation_width`.
    pub fn with_widths(
        rows: &[(&[i64], &[i64])],
        prompt_width: usize,
        continuation_width: usize,
        pad_id: i64,
    ) -> PaddedRows {
        let p = rows
            .iter()
            .map(|r| r.0.len())
            .fold(prompt_width, usize::max);
        let c = rows
            .iter()
            .map(|r| r.1.len())
            .fold(continuation_width, usize::max);
        let width = p + c;
        let n = rows.len();
        let mut ids = vec![pad_id; n * width];
        let mut mask = vec![0i64; n * width];
        let mut positions = vec![0i64; n * width];
        for (i, (prompt, continuation)) in rows.iter().enumerate() {
            let row = i * width;
            let start = row + p - prompt.len();
            ids[start..start + prompt.len()].copy_from_slice(prompt);
            ids[row + p..row + p + continuation.len()].copy_from_slice(continuation);
            // The real tokens are the columns [P - |prompt|, P + |continuation|).
            let real = p - prompt.len()..p + continuation.len();
            let mut seen = 0i64;
            for col in 0..width {
                if real.contains(&col) {
                    mask[row + col] = 1;
                    seen += 1;
                }
                positions[row + col] = (seen - 1).max(0);
            }
        }
        PaddedRows {
            ids,
            mask,
            positions,
            rows: n,
            prompt_width: p,
            continuation_width: c,
        }
    }

    pub fn width(&self) -> usize {
        self.prompt_width + self.continuation_width
    }

    /// `(ids, mask, positions)` as (rows, P + R) i64 tensors on `device`.
    pub fn tensors(&self, device: Device) -> (Tensor, Tensor, Tensor) {
        let shape = [self.rows as i64, self.width() as i64];
        let t = |v: &[i64]| Tensor::from_slice(v).view(shape).to_device(device);
        (t(&self.ids), t(&self.mask), t(&self.positions))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_left_continuations_right_positions_as_from_the_mask() {
        let rows: [(&[i64], &[i64]); 3] = [(&[1, 2], &[3]), (&[4], &[5, 6, 7]), (&[], &[8])];
        let p = PaddedRows::new(&rows, 9);
        assert_eq!((p.prompt_width, p.continuation_width), (2, 3));
        #[rustfmt::skip]
        assert_eq!(p.ids, [
            1, 2, 3, 9, 9,
            9, 4, 5, 6, 7,
            9, 9, 8, 9, 9,
        ]);
        #[rustfmt::skip]
        assert_eq!(p.mask, [
            1, 1, 1, 0, 0,
            0, 1, 1, 1, 1,
            0, 0, 1, 0, 0,
        ]);
        let (_, mask, positions) = p.tensors(Device::Cpu);
        assert_eq!(
            Vec::<i64>::try_from(positions.reshape([-1])).unwrap(),
            Vec::<i64>::try_from(crate::position_ids_from_mask(&mask).reshape([-1])).unwrap()
        );
        // Prompts alone: left padding; continuations alone: right padding.
        let left = PaddedRows::new(&[(&[1, 2, 3][..], &[][..]), (&[4][..], &[][..])], 0);
        assert_eq!(left.ids, [1, 2, 3, 0, 0, 4]);
        let right = PaddedRows::new(&[(&[][..], &[1, 2, 3][..]), (&[][..], &[4][..])], 0);
        assert_eq!(right.ids, [1, 2, 3, 4, 0, 0]);
        assert_eq!(right.positions, [0, 1, 2, 0, 0, 0]);
        // At least the given widths.
        let wide = PaddedRows::with_widths(&[(&[1][..], &[2][..])], 3, 2, 0);
        assert_eq!(wide.ids, [0, 0, 1, 2, 0]);
    }
}
