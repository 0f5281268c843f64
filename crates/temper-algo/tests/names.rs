//! Config names: verl's spellings, explicit aliases, errors that list the known names, serde.

use temper_algo::advantage::{contiguous_groups, filter_groups, zero_adv_groups};
use temper_algo::kl::KlEstimator;
use temper_algo::{AdvEstimator, AggMode, KlType, PolicyLossMode, PolicyLossParams};

#[test]
fn canonical_names_round_trip() {
    for &m in AggMode::ALL {
        assert_eq!(m.to_string().parse::<AggMode>().unwrap(), m);
    }
    for &m in PolicyLossMode::ALL {
        assert_eq!(m.to_string().parse::<PolicyLossMode>().unwrap(), m);
    }
    for &e in AdvEstimator::ALL {
        assert_eq!(e.to_string().parse::<AdvEstimator>().unwrap(), e);
    }
    for s in ["k1", "abs", "k2", "k3", "k1+", "abs+", "k3+"] {
        assert_eq!(s.parse::<KlType>().unwrap().to_string(), s);
    }
}

#[test]
fn aliases() {
    assert_eq!(
        "low_var_kl".parse::<KlType>().unwrap(),
        KlType::plain(KlEstimator::K3)
    );
    assert_eq!(
        "mse".parse::<KlType>().unwrap(),
        KlType::plain(KlEstimator::K2)
    );
    assert_eq!(
        "kl".parse::<KlType>().unwrap(),
        KlType::plain(KlEstimator::K1)
    );
    let st = "low_var_kl+".parse::<KlType>().unwrap();
    assert!(st.straight_through && st.estimator == KlEstimator::K3);
    // k2's gradient is k2's: "k2+" is plain k2.
    assert_eq!(
        "k2+".parse::<KlType>().unwrap(),
        KlType::plain(KlEstimator::K2)
    );
    assert_eq!(
        "gmpo".parse::<PolicyLossMode>().unwrap(),
        PolicyLossMode::GeoMean
    );
    assert_eq!(
        "importance_sampling".parse::<PolicyLossMode>().unwrap(),
        PolicyLossMode::TinkerImportanceSampling
    );
    assert_eq!("token_mean".parse::<AggMode>().unwrap(), AggMode::TokenMean);
}

#[test]
fn unknown_names_list_the_known_ones() {
    let e = "ppo".parse::<PolicyLossMode>().unwrap_err().to_string();
    assert!(
        e.contains("\"ppo\"")
            && e.contains("vanilla")
            && e.contains("grpo_clip")
            && e.contains("tinker_ppo"),
        "{e}"
    );
    let e = "token-avg".parse::<AggMode>().unwrap_err().to_string();
    assert!(e.contains("seq-mean-token-sum-norm"), "{e}");
    let e = "k4".parse::<KlType>().unwrap_err().to_string();
    assert!(e.contains("low_var_kl") && e.contains("k3+"), "{e}");
    let e = "ppo".parse::<AdvEstimator>().unwrap_err().to_string();
    assert!(e.contains("reinforce_plus_plus_baseline"), "{e}");
}

#[test]
fn serde_from_config_strings() {
    let m: AggMode = serde_json::from_str("\"seq-mean-token-sum-norm\"").unwrap();
    assert_eq!(m, AggMode::SeqMeanTokenSumNorm);
    assert!(serde_json::from_str::<AggMode>("\"seq-mean\"")
        .unwrap_err()
        .to_string()
        .contains("token-mean"));
    let k: KlType = serde_json::from_str("\"k3+\"").unwrap();
    assert!(k.straight_through);
    assert_eq!(
        serde_json::to_string(&PolicyLossMode::Cispo).unwrap(),
        "\"cispo\""
    );
}

#[test]
fn policy_loss_params_aliases() {
    // slime's recommended CISPO bounds [0, 5]: eps_clip = 1.0, eps_clip_high = 4.0.
    let p: PolicyLossParams =
        serde_json::from_str(r#"{"eps_clip": 1.0, "eps_clip_high": 4.0}"#).unwrap();
    assert_eq!((1.0 - p.lo(), 1.0 + p.hi()), (0.0, 5.0));
    // slime's eps_clip alone sets both sides.
    let p: PolicyLossParams = serde_json::from_str(r#"{"eps_clip": 0.3}"#).unwrap();
    assert_eq!((p.lo(), p.hi()), (0.3, 0.3));
    // CS336's cliprange.
    let p: PolicyLossParams = serde_json::from_str(r#"{"cliprange": 0.1}"#).unwrap();
    assert_eq!((p.lo(), p.hi(), p.clip_ratio_c), (0.1, 0.1, Some(3.0)));
    // verl's names; null disables dual clip.
    let p: PolicyLossParams = serde_json::from_str(
        r#"{"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": null}"#,
    )
    .unwrap();
    assert_eq!((p.lo(), p.hi(), p.clip_ratio_c), (0.2, 0.28, None));
    assert!(serde_json::from_str::<PolicyLossParams>(r#"{"clip_ratio_hi": 0.3}"#).is_err());
}

#[test]
fn dr_grpo_preset() {
    let p = AdvEstimator::DrGrpo.preset().unwrap();
    assert!(!p.norm_adv_by_std_in_grpo && !p.use_kl_loss);
    assert_eq!(p.loss_agg_mode, AggMode::SeqMeanTokenSumNorm);
    assert!(AdvEstimator::Grpo.preset().is_none());
}

#[test]
fn zero_advantage_groups_and_filter() {
    // Groups: [1,0], [1,1] (equal), [0.5] (alone), [0,0,0] (equal), interleaved ids.
    let scores = [1.0, 1.0, 0.0, 1.0, 0.5, 0.0, 0.0, 0.0];
    let index = [0, 1, 0, 1, 2, 3, 3, 3];
    assert_eq!(zero_adv_groups(&scores, &index), 2);
    assert_eq!(
        filter_groups(&scores, &index),
        vec![true, false, true, false, true, false, false, false]
    );
    assert_eq!(contiguous_groups(6, 3).unwrap(), vec![0, 0, 0, 1, 1, 1]);
    assert!(contiguous_groups(7, 3).is_err());
}
