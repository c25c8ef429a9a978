//! Containers through libdaos and libdfs on a real DAOS 2.8.0 system (see
//! `libdaos_support`). Without a DAOS 2.8.0 prefix the test says SKIPPED.

mod libdaos_support;

#[test]
fn containers_through_libdaos_match_the_daos_tool_on_daos_2_8_0() {
    libdaos_support::containers_match_the_daos_tool(
        "containers_through_libdaos_match_the_daos_tool_on_daos_2_8_0",
        "2.8.0",
    );
}
