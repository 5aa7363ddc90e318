pub mod decode_step;
