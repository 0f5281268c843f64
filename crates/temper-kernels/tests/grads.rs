//! Gradient slots: a zero gradient given before the backward ends as the backward's own gradient,
//! bit for bit, and clearing drops it (PyTorch's `p.grad = None`).
use tch::{Device, Kind, Tensor};

#[test]
fn a_zero_gradient_given_first_ends_as_autograds_own() {
    tch::manual_seed(5);
    let x = Tensor::randn([37, 11], (Kind::Float, Device::Cpu));
    let loss = |w: &Tensor| (x.matmul(w).tanh() * 3.0).sum(Kind::Float);
    let plain = Tensor::randn([11, 5], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let given = plain.detach().copy().set_requires_grad(true);
    loss(&plain).backward();

    let params = vec![("w".to_string(), given.shallow_clone())];
    temper_kernels::zero_grads_if_missing(&params).unwrap();
    let slot = given.grad();
    assert_eq!(slot.size(), given.size());
    assert_eq!(slot.kind(), Kind::Float);
    assert_eq!(slot.abs().sum(Kind::Float).double_value(&[]), 0.0);
    loss(&given).backward();
    assert!(
        given.grad().equal(&plain.grad()),
        "accumulated gradient differs"
    );
    // The backward added into the slot given, not a new tensor.
    assert_eq!(given.grad().data_ptr(), slot.data_ptr());

    // A gradient already there is kept as it is.
    temper_kernels::zero_grads_if_missing(&params).unwrap();
    assert!(given.grad().equal(&plain.grad()));

    temper_kernels::clear_grads(&params).unwrap();
    assert!(!given.grad().defined());
}
