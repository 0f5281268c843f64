//! How a step's responses are split into mini-batches (one optimizer step each) and micro-batches
//! (one forward/backward each), and, data-parallel, which micro-batches are this rank's.
use rand::seq::SliceRandom;
use rand::SeedableRng;

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
}

/// One optimizer step's rows: all of them (the loss normalises by their token count) and this
/// rank's micro-batches.
#[derive(Clone)]
pub(crate) struct MiniBatch {
    pub all: Vec<i64>,
    pub mine: Vec<Vec<i64>>,
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
        order
            .chunks(self.mini)
            .map(|mb| {
                let bound = |r: usize| r * mb.len() / self.world;
                let mine = &mb[bound(self.rank)..bound(self.rank + 1)];
                MiniBatch {
                    all: mb.to_vec(),
                    mine: mine.chunks(self.micro.max(1)).map(|c| c.to_vec()).collect(),
                }
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
        assert_eq!(a[0].all, b[0].all);
        assert_eq!([a[0].mine.concat(), b[0].mine.concat()].concat(), a[0].all);
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
