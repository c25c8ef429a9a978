//! DFS through libdfs on a real DAOS 2.8.0 system (see `libdfs_support`). Without a DAOS
//! 2.8.0 prefix the test says SKIPPED.

mod libdfs_support;

#[test]
fn libdfs_agrees_with_a_local_directory_on_daos_2_8_0() {
    libdfs_support::libdfs_agrees_with_a_local_directory(
        "libdfs_agrees_with_a_local_directory_on_daos_2_8_0",
        "2.8.0",
    );
}
