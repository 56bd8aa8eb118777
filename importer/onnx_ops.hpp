// What the ONNX op handlers share (onnx_ops.cpp: windowed ops; onnx_ops_pixel.cpp: the
// rest and the table). Internal to the importer.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "importer/onnx_translator.hpp"

namespace ht::onnx_import {

std::string show(const std::vector<int64_t>& v);
std::vector<float> oihw_to_keras(const Constant& w);  // [O][I][kH][kW] -> (kH, kW, I, O)
std::vector<float> floats(const Constant& c);
// y, made from x by a layer that keeps its layout: channels-last stays channels-last, a
// [N, C, 1, 1] vector keeps that form, a flattened map's order stays to be permuted.
Value same_layout(const Value& x, Value y);

void add_window_ops(std::map<std::string, OpHandler>& table);
void add_pixel_ops(std::map<std::string, OpHandler>& table);

}  // namespace ht::onnx_import
