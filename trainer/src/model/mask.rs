//! Length masks built on the device: one `[B]` integer upload per mask instead of a `[B, T]`
//! host array (for the PCM mask, as large as the audio itself).

use burn::prelude::*;

/// `[B, T]`: true on each row's first `lens[b]` positions, false after.
pub fn valid<B: Backend>(lens: &[usize], t: usize, device: &B::Device) -> Tensor<B, 2, Bool> {
    let b = lens.len();
    let lens: Vec<i64> = lens.iter().map(|&n| n as i64).collect();
    let lens = Tensor::<B, 1, Int>::from_data(TensorData::new(lens, [b]), device)
        .reshape([b, 1])
        .expand([b, t]);
    let positions = Tensor::<B, 1, Int>::arange(0..t as i64, device).reshape([1, t]).expand([b, t]);
    positions.lower(lens)
}

/// [`valid`] as 1.0 and 0.0.
pub fn keep<B: Backend>(lens: &[usize], t: usize, device: &B::Device) -> Tensor<B, 2> {
    valid::<B>(lens, t, device).float()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;

    #[test]
    fn marks_each_row_s_first_positions() {
        let m = keep::<NdArray>(&[0, 2, 5, 7], 5, &Default::default());
        let want: Vec<f32> = [0, 2, 5, 7]
            .iter()
            .flat_map(|&n| (0..5).map(move |j| if j < n { 1.0 } else { 0.0 }))
            .collect();
        assert_eq!(m.into_data().to_vec::<f32>().unwrap(), want);
    }
}
