//! DFS through libdfs on a real DAOS 2.6.5 system (see `libdfs_support`). Without a DAOS
//! 2.6.5 prefix the test says SKIPPED.

mod libdfs_support;

#[test]
fn libdfs_agrees_with_a_local_directory_on_daos_2_6_5() {
    libdfs_support::libdfs_agrees_with_a_local_directory(
        "libdfs_agrees_with_a_local_directory_on_daos_2_6_5",
        "2.6.5",
    );
}
