# Tests that run programs rather than gtest binaries: the PyTorch oracle (label `oracle`)
# and MPI runs through mpirun (label `mpi`).
set(HT_PYTHON /usr/bin/python3)

# A Python test script driving the real binary: `script HALOTRAIN ARGS...`.
function(ht_script_test name labels timeout script)
  add_test(NAME ${name} COMMAND ${HT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/${script} $<TARGET_FILE:halotrain> ${ARGN})
  set_tests_properties(${name} PROPERTIES LABELS "${labels}" TIMEOUT ${timeout})
endfunction()
foreach(case classifier_adam segmentation_bce_sgd regression_mse_pools activations_max_adam residual_sgd
             separable_max_sgd unet_bce_adam unet_softmax_sgd transpose_two_pools_adam
             skip_concat_adam large_mean_batch_norm_adam
             # SPEC section 11 (tests/oracle/cases_section11.py)
             mbconv_se_adam convnext_adam aspp_softmax_sgd grouped_bottleneck_sgd dense_shuffle_adam
             vgg_flatten_sgd nnunet_norms_adam large_mean_norms_sgd nonsquare_windows_adam
             resize_any_ratio_adam small_tail_sgd
             # SPEC section 14 (tests/oracle/cases_section14.py)
             frozen_backbone_adam freeze_unfreeze_sgd class_weights_adam class_map_weights_sgd
             mask_pos_weight_sgd)
  add_test(NAME oracle_${case}
           COMMAND ${HT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/oracle/oracle.py ${case}
                   --halotrain $<TARGET_FILE:halotrain> --workdir ${CMAKE_BINARY_DIR}/oracle
                   --mpirun ${MPIEXEC_EXECUTABLE})
  set_tests_properties(oracle_${case} PROPERTIES LABELS "oracle;mpi" TIMEOUT 900)
endforeach()

# torchvision's resnet18, written out as a config by the test, against itself in float64.
add_test(NAME oracle_torchvision_resnet18
         COMMAND ${HT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/oracle/torchvision_resnet18.py
                 --halotrain $<TARGET_FILE:halotrain> --workdir ${CMAKE_BINARY_DIR}/oracle)
set_tests_properties(oracle_torchvision_resnet18 PROPERTIES LABELS "oracle" TIMEOUT 900)

# SPEC section 8 against PyTorch (tests/oracle/section8_oracle.py): predict, evaluate and
# validation, lr schedules / weight decay / accumulate, augmentation and downsampling.
foreach(part predict evaluate optimizer augment)
  add_test(NAME section8_${part}
           COMMAND ${HT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/oracle/section8_oracle.py ${part}
                   --halotrain $<TARGET_FILE:halotrain> --workdir ${CMAKE_BINARY_DIR}/section8
                   --mpirun ${MPIEXEC_EXECUTABLE})
  set_tests_properties(section8_${part} PROPERTIES LABELS "oracle;mpi" TIMEOUT 600)
endforeach()

# Halo exchange over MPI, one rank per shard (and sample groups when ranks exceed the grid).
add_executable(halo_mpi_test ${CMAKE_CURRENT_SOURCE_DIR}/mpi/halo_mpi_test.cpp)
target_link_libraries(halo_mpi_test PRIVATE halotrain_worker)
target_include_directories(halo_mpi_test PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
set(HT_MPIRUN ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)
foreach(spec "4;1;4;67;41" "4;4;1;41;67" "4;2;2;53;47" "6;3;2;71;45" "8;2;2;53;47")
  list(GET spec 0 np)
  list(GET spec 1 rows)
  list(GET spec 2 cols)
  list(GET spec 3 h)
  list(GET spec 4 w)
  add_test(NAME halo_mpi_np${np}_grid${rows}x${cols}
           COMMAND ${HT_MPIRUN} -np ${np} $<TARGET_FILE:halo_mpi_test> ${rows} ${cols} ${h} ${w})
  set_tests_properties(halo_mpi_np${np}_grid${rows}x${cols} PROPERTIES LABELS mpi TIMEOUT 120)
endforeach()

# One rank killed: the job ends non-zero within 60 s.
add_test(NAME mpi_kill_one_rank
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/kill_rank.sh $<TARGET_FILE:halotrain> ${MPIEXEC_EXECUTABLE}
                 ${CMAKE_BINARY_DIR}/kill-rank)
set_tests_properties(mpi_kill_one_rank PROPERTIES LABELS mpi TIMEOUT 150)

# The halotrain CLI with the test tree's layer kinds (tests/common/test_layers.cpp) added
# through the registry: `test_leak` leaks host memory per step, as a leaking library would.
add_executable(halotrain_test_layers ${PROJECT_SOURCE_DIR}/cli/main.cpp
               ${CMAKE_CURRENT_SOURCE_DIR}/common/test_layers.cpp)
target_link_libraries(halotrain_test_layers PRIVATE halotrain_import halotrain_worker halotrain_orchestrator)

# Checkpoint exactness, recycling and robustness through the real binary.
ht_script_test(checkpoint_resume_recycle "checkpoint" 600 checkpoint/resume_test.py
               ${CMAKE_BINARY_DIR}/resume-test $<TARGET_FILE:halotrain_test_layers>)

# Slurm end to end on a real single-node cluster (slurm/local-cluster: root, slurm-wlm,
# munge; skipped without them). One cluster at a time, hence the lock. The render and
# validation unit tests are tests/unit/slurm_test.cpp (label `unit`).
foreach(scenario bad_input completes restart requeue kill_rank two_nodes node_loss)
  add_test(NAME slurm_${scenario}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/slurm/e2e.sh $<TARGET_FILE:halotrain>
                   ${CMAKE_BINARY_DIR}/slurm-e2e ${scenario})
  set_tests_properties(slurm_${scenario} PROPERTIES LABELS slurm TIMEOUT 300 SKIP_RETURN_CODE 77
                       RESOURCE_LOCK halotrain_local_slurm)
endforeach()

# `halotrain import` (SPEC section 9) of Keras 2 model files written by the test ...
ht_script_test(import_keras "import" 600 import/keras_import_test.py ${CMAKE_BINARY_DIR}/import-keras)
# ... and of ONNX files from torch.onnx.export: torchvision resnet18 and a U-Net trained as torch does.
ht_script_test(import_onnx "import" 600 import/onnx_import_test.py ${CMAKE_BINARY_DIR}/import-onnx)
# ... and of the convolutional models of torchvision (tests/import/zoo_test.py): predict on a 2x2
# grid equal to torch's eval forward, three of them trained sharded equal to torch.
ht_script_test(import_zoo "import" 900 import/zoo_test.py ${CMAKE_BINARY_DIR}/import-zoo)
# ... and keras.applications as Keras 2.1 and 2.2 saved them (VGG16, ResNet50, InceptionV3,
# MobileNet, Xception, DenseNet121, at reduced width) and a model of the newer vocabulary,
# trained a step sharded equal to PyTorch float64 (tests/import/keras_apps_test.py).
ht_script_test(import_keras_apps "import" 900 import/keras_apps_test.py ${CMAKE_BINARY_DIR}/import-keras-apps)

# The graph configs (unet-demo, resnet-mammo at 1/16 on CPU) train with the memory model exact.
ht_script_test(memory_graph_configs "memory" 600 memory/graph_configs_test.py ${CMAKE_BINARY_DIR}/graph-configs)

# Activation policies keep/offload/recompute/auto on the demo: bit-identical checkpoints,
# measured peak memory per rank within 10% of the memory model, a tight budget honoured.
ht_script_test(memory_policies "memory" 600 memory/policies_test.py
               ${CMAKE_BINARY_DIR}/memory-policies)

# Conv + ReLU/ReLU6 chains on grid [2, 2] under keep, offload and recompute: checkpoints
# bit-identical to the layers run apart, the memory model exact.
ht_script_test(memory_conv_chain "memory" 300 memory/conv_chain_test.py ${CMAKE_BINARY_DIR}/conv-chain)

# The source tree's includes depend one way: no cycle between files, the worker's
# libraries (io, runtime, comm, layers, run) include only those below them.
ht_script_test(include_layout "unit" 60 python/include_layout_test.py)

# The worker executes the step schedule: a real step's allocations and frees, traced per
# operation, equal `plan --schedule`'s on every rank (chains, U-Net, ResNet, EfficientNet;
# every policy, micro-batches, frozen layers).
ht_script_test(memory_schedule_trace "memory" 600 memory/schedule_trace_test.py
               ${CMAKE_BINARY_DIR}/schedule-trace)

# SPEC section 14 end to end (tests/finetune/finetune_test.py): early stopping, the plateau
# schedule and best.h5 against Keras rules, resumed mid-patience bit for bit; frozen layers.
ht_script_test(finetune "checkpoint" 600 finetune/finetune_test.py ${CMAKE_BINARY_DIR}/finetune)

# SPEC section 13 (tests/data/manifest_test.py): PNG, TIFF and DICOM files from a CSV
# manifest train as an HDF5 file of the same values, bit for bit; data.fit; bad files.
ht_script_test(data_manifest "checkpoint;mpi" 600 data/manifest_test.py ${MPIEXEC_EXECUTABLE}
               ${CMAKE_BINARY_DIR}/data-manifest)
# predict --output DIR/ (tests/data/predict_output_test.py): a BigTIFF per image, cropped
# back to its size, equal to predict's .h5; a classifier's scores.csv; clashing names.
ht_script_test(data_predict_output "mpi" 300 data/predict_output_test.py ${MPIEXEC_EXECUTABLE}
               ${CMAKE_BINARY_DIR}/data-predict-output)

# Hostile input, signals and kills (tests/cli/robustness_test.py): exit codes of SPEC
# section 2, one clear message, no checkpoint lost. Every run inside has its own timeout.
ht_script_test(cli_robustness "checkpoint" 600 cli/robustness_test.py
               ${CMAKE_BINARY_DIR}/robustness-test)

# Bad input to validation, evaluate and predict, and a predict killed mid-write
# (tests/cli/section8_input_test.py).
ht_script_test(section8_input "checkpoint" 600 cli/section8_input_test.py
               ${CMAKE_BINARY_DIR}/section8-input)

# A stop while blocked in a collective ends the job within slurm.signal_before; fewer
# images than a batch and a data file cut short are said plainly.
ht_script_test(stop_and_data "checkpoint;mpi" 300 cli/stop_and_data_test.py
               ${MPIEXEC_EXECUTABLE} ${CMAKE_BINARY_DIR}/stop-and-data)

# Soak, short form (the long one is in bench/run-all): 1500 steps, recycle every 50, a
# checkpoint every 10, 8 SIGKILLs (some mid-write) each resumed; bit for bit at the end,
# every checkpoint verifying after every kill, RSS flat across recycles.
ht_script_test(soak_short "soak" 600 soak/soak.py
               ${CMAKE_BINARY_DIR}/soak --steps 1500 --kills 8)

# report.html in headless chromium without network (tests/report/report_test.py): the DOM
# against metrics.csv and the plan, a screenshot, bad input.
ht_script_test(report_browser "report" 600 report/report_test.py
               ${CMAKE_BINARY_DIR}/report-test)

# The GPU check bundle (scripts/gpu-check) builds from this build and holds everything its
# five parts need; what a GPU machine would run is listed, nothing is run.
if(TARGET halotrain_cuda)
  add_test(NAME gpu_check_bundle
           COMMAND sh -c "GPU_CHECK_BUILD='${CMAKE_BINARY_DIR}' '${PROJECT_SOURCE_DIR}/scripts/gpu-check' bundle '${CMAKE_BINARY_DIR}/gpu-bundle' && '${CMAKE_BINARY_DIR}/gpu-bundle/gpu-check' all --dry-run")
  set_tests_properties(gpu_check_bundle PROPERTIES LABELS bundle TIMEOUT 300)
endif()
