//! How a step's responses are split into mini-batches (one optimizer step each) and micro-batches
//! (one forward/backward each), and, data-parallel, which micro-batches are this rank's.
use std::borrow::Borrow;
use std::ops::Deref;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use tch::{Device, Tensor};

use temper_base::seed::mix;

pub(crate) struct Partition {
    pub rows: usize,
    /// Responses per mini-batch (all ranks together).
    pub mini: usize,
    /// Responses per micro-batch (per rank).
    pub micro: usize,
    pub shuffle: bool,
    pub seed: u64,
    pub rank: usize,
    pub world: usize,
    /// Where the batch's tensors are (the rows' indices travel there once per call of
    /// [`Partition::parts`]).
    pub device: Device,
}

/// One optimizer step's rows: all of them (the loss normalises by their token count) and this
/// rank's micro-batches.
#[derive(Clone)]
pub(crate) struct MiniBatch {
    pub all: Rows,
    pub mine: Vec<Rows>,
}

/// Row indices into a step's batch, with their copy on the batch's device. A micro-batch's rows
/// are read out of several tensors (ids, masks, log-probs, advantages), and an index copied from
/// the host is a synchronising copy on a GPU: [`Partition::parts`] sends all of its indices in
/// one copy, and each `Rows` is a view of it.
#[derive(Debug)]
pub(crate) struct Rows {
    idx: Vec<i64>,
    on_device: Tensor,
}

impl Rows {
    /// `idx` with its own copy on `device` (for rows outside a partition).
    pub fn new(idx: Vec<i64>, device: Device) -> Rows {
        let on_device = Tensor::from_slice(&idx).to(device);
        Rows { idx, on_device }
    }

    /// The indices as an i64 tensor on the batch's device.
    pub fn on_device(&self) -> &Tensor {
        &self.on_device
    }

    /// `len` of these rows from `start`, sharing the device copy.
    pub fn narrow(&self, start: i64, len: i64) -> Rows {
        let (s, l) = (start as usize, len as usize);
        Rows {
            idx: self.idx[s..s + l].to_vec(),
            on_device: self.on_device.narrow(0, start, len),
        }
    }

    /// These rows of a (N, ...) tensor: a view when they are consecutive, else gathered.
    pub fn of(&self, t: &Tensor) -> Tensor {
        let consecutive = self.idx.windows(2).all(|w| w[1] == w[0] + 1);
        match self.idx.first() {
            Some(&first) if consecutive => t.narrow(0, first, self.idx.len() as i64),
            _ => t.index_select(0, &self.on_device),
        }
    }
}

impl Clone for Rows {
    fn clone(&self) -> Rows {
        Rows {
            idx: self.idx.clone(),
            on_device: self.on_device.shallow_clone(),
        }
    }
}

impl Deref for Rows {
    type Target = [i64];
    fn deref(&self) -> &[i64] {
        &self.idx
    }
}

impl Borrow<[i64]> for Rows {
    fn borrow(&self) -> &[i64] {
        &self.idx
    }
}

impl PartialEq<Vec<i64>> for Rows {
    fn eq(&self, other: &Vec<i64>) -> bool {
        &self.idx == other
    }
}

impl Partition {
    /// The mini-batches of `epoch` (rows shuffled per epoch when `shuffle`). Each mini-batch is
    /// split into `world` contiguous shares (rank r takes the r-th; equal when `world` divides
    /// the mini-batch, else they differ by one row and every row is still some rank's) and a
    /// share into micro-batches of `micro` rows; with one rank that is the plain split. With
    /// `micro` dividing a share, the micro-batches are the same whatever the world size, which is
    /// what makes a 2-rank step equal to a 1-rank one.
    pub fn parts(&self, epoch: usize) -> Vec<MiniBatch> {
        let mut order: Vec<i64> = (0..self.rows as i64).collect();
        if self.shuffle {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(mix(self.seed, epoch as u64, 0));
            order.shuffle(&mut rng);
        }
        let split: Vec<(&[i64], Vec<&[i64]>)> = order
            .chunks(self.mini)
            .map(|mb| {
                let bound = |r: usize| r * mb.len() / self.world;
                let mine = &mb[bound(self.rank)..bound(self.rank + 1)];
                (mb, mine.chunks(self.micro.max(1)).collect())
            })
            .collect();
        // Every index list, back to back, in one copy to the device.
        let flat: Vec<i64> = split
            .iter()
            .flat_map(|(all, mine)| all.iter().chain(mine.iter().copied().flatten()))
            .copied()
            .collect();
        let on_device = Tensor::from_slice(&flat).to(self.device);
        let mut at = 0;
        let mut rows = |idx: &[i64]| {
            let view = on_device.narrow(0, at, idx.len() as i64);
            at += idx.len() as i64;
            Rows {
                idx: idx.to_vec(),
                on_device: view,
            }
        };
        split
            .iter()
            .map(|(all, mine)| MiniBatch {
                all: rows(all),
                mine: mine.iter().map(|m| rows(m)).collect(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_take_equal_shares_split_like_one_rank() {
        let p = |rank, world, micro| Partition {
            rows: 16,
            mini: 8,
            micro,
            shuffle: false,
            seed: 0,
            rank,
            world,
            device: Device::Cpu,
        };
        let one = p(0, 1, 2).parts(0);
        assert_eq!(one.len(), 2);
        assert_eq!(
            one[0].mine,
            vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
        );
        let r1 = p(1, 2, 2).parts(0);
        assert_eq!(r1[0].all, (0..8).collect::<Vec<i64>>());
        assert_eq!(r1[0].mine, vec![vec![4, 5], vec![6, 7]]);
        assert_eq!(r1[1].mine, vec![vec![12, 13], vec![14, 15]]);
        // Shuffled: the same order on every rank.
        let (a, b) = (
            Partition {
                shuffle: true,
                ..p(0, 2, 4)
            }
            .parts(1),
            Partition {
                shuffle: true,
                ..p(1, 2, 4)
            }
            .parts(1),
        );
        assert_eq!(a[0].all.to_vec(), b[0].all.to_vec());
        assert_eq!(
            [a[0].mine.concat(), b[0].mine.concat()].concat(),
            a[0].all.to_vec()
        );
        // Each list's copy on the device is its own indices (views of one copy).
        for rows in a
            .iter()
            .flat_map(|mb| std::iter::once(&mb.all).chain(&mb.mine))
        {
            assert_eq!(
                Vec::<i64>::try_from(rows.on_device()).unwrap(),
                rows.to_vec()
            );
        }
        // A mini-batch the world does not divide: every row is one rank's.
        let odd = |rank| Partition {
            rows: 5,
            mini: 5,
            ..p(rank, 2, 2)
        };
        assert_eq!(odd(0).parts(0)[0].mine, vec![vec![0, 1]]);
        assert_eq!(odd(1).parts(0)[0].mine, vec![vec![2, 3], vec![4]]);
    }
}
