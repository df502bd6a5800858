//! `sqlx::migrate!` reads `migrations/` when the crate compiles; cargo does
//! not know that, so a new or edited migration alone would leave a build
//! with the old list (and CI's cached target directory with it).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
