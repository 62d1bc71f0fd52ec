//! Pod and member selection strategies, one per file.

pub mod least_loaded;
