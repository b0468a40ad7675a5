# The command line as a user runs it.
add_test(NAME e2e.cli COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli_test.sh $<TARGET_FILE:deepinfer> ${PROJECT_SOURCE_DIR})
set_tests_properties(e2e.cli PROPERTIES LABELS e2e TIMEOUT 300)
