//! The seeded order in which prompts are visited: a permutation per epoch (when shuffling), cut
//! into batches of `train_batch_size`; the last partial batch of an epoch is dropped (verl's
//! `drop_last=True`). A position is `(epoch, batch)`, which is all a checkpoint needs to resume.
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

#[derive(Debug, Clone)]
pub struct DataOrder {
    pub len: usize,
    pub batch_size: usize,
    pub shuffle: bool,
    pub seed: u64,
}

impl DataOrder {
    pub fn batches_per_epoch(&self) -> usize {
        self.len / self.batch_size
    }

    /// The epoch of the `step`-th batch overall (0-based).
    pub fn epoch_of(&self, step: usize) -> usize {
        step / self.batches_per_epoch().max(1)
    }

    /// The example indices of the `step`-th batch overall (0-based) and its epoch.
    pub fn batch(&self, step: usize) -> (usize, Vec<usize>) {
        let (epoch, b) = (self.epoch_of(step), step % self.batches_per_epoch().max(1));
        let perm = self.permutation(epoch);
        (
            epoch,
            perm[b * self.batch_size..(b + 1) * self.batch_size].to_vec(),
        )
    }

    fn permutation(&self, epoch: usize) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
            rng.set_stream(epoch as u64);
            idx.shuffle(&mut rng);
        }
        idx
    }
}
