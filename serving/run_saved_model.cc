// Loads an op library and a SavedModel the way TensorFlow Serving does, and
// runs signature requests against it: the serving-path check of tf_dietcode.
//
// TF Serving links the ops into its binary and loads models with the C++
// SavedModel loader (LoadSavedModel: restore the variables, feed the asset
// paths of the model's own directory, run the init op). The pip wheel exports
// that loader only through the C API (TF_LoadSessionFromSavedModel), so this
// program uses it, and TF_LoadLibrary stands in for the static link. Like
// Serving, it maps a request's signature name to tensors through the
// MetaGraphDef's SignatureDefs.
//
//   run_saved_model OP_LIBRARY SAVED_MODEL_DIR REQUEST_DIR...
//
// A request directory holds `signature` (the signature key, as text) and one
// `<input key>.pb` per signature input (a serialized TensorProto, as in a
// PredictRequest); the outputs are written beside them as
// `<output key>.out.pb`. The model is loaded once for all requests.

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensorflow/c/c_api.h"
#include "tensorflow/c/tf_tstring.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/protobuf/meta_graph.pb.h"

namespace {

template <typename T, void (*Delete)(T*)>
struct Deleter {
  void operator()(T* p) const { Delete(p); }
};
using Status = std::unique_ptr<TF_Status, Deleter<TF_Status, TF_DeleteStatus>>;
using Tensor = std::unique_ptr<TF_Tensor, Deleter<TF_Tensor, TF_DeleteTensor>>;

void Check(const TF_Status* status, const std::string& what) {
  if (TF_GetCode(status) != TF_OK) throw std::runtime_error(what + ": " + TF_Message(status));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  out << data;
  if (!out) throw std::runtime_error("cannot write " + path);
}

// "name:index" -> the graph's output it names.
TF_Output GraphTensor(TF_Graph* graph, const std::string& tensor_name) {
  const size_t colon = tensor_name.rfind(':');
  const std::string op = tensor_name.substr(0, colon);
  TF_Operation* operation = TF_GraphOperationByName(graph, op.c_str());
  if (operation == nullptr) throw std::runtime_error("no operation " + op + " in the graph");
  return {operation, colon == std::string::npos ? 0 : std::stoi(tensor_name.substr(colon + 1))};
}

// Any TensorProto a request may hold (tensor_content or the typed value fields): numbers, or
// strings (text a model tokenizes itself), copied into the TF_TString elements of a TF_STRING
// tensor, which ReleaseStrings frees.
Tensor FromProto(const tensorflow::TensorProto& proto, const std::string& what) {
  tensorflow::Tensor value;
  const bool text = proto.dtype() == tensorflow::DT_STRING;
  if (!value.FromProto(proto) || !(text || tensorflow::DataTypeCanUseMemcpy(value.dtype()))) {
    throw std::runtime_error(what + ": not a numeric or string TensorProto");
  }
  std::vector<int64_t> dims;
  for (const int64_t d : value.shape().dim_sizes()) dims.push_back(d);
  if (text) {
    Tensor tensor(TF_AllocateTensor(TF_STRING, dims.data(), static_cast<int>(dims.size()),
                                    value.NumElements() * sizeof(TF_TString)));
    auto* strings = static_cast<TF_TString*>(TF_TensorData(tensor.get()));
    const auto elements = value.flat<tensorflow::tstring>();
    for (int64_t i = 0; i < value.NumElements(); ++i) {
      TF_StringInit(&strings[i]);
      TF_StringCopy(&strings[i], elements(i).data(), elements(i).size());
    }
    return tensor;
  }
  const auto data = value.tensor_data();
  Tensor tensor(TF_AllocateTensor(static_cast<TF_DataType>(value.dtype()), dims.data(),
                                  static_cast<int>(dims.size()), data.size()));
  if (!data.empty()) std::memcpy(TF_TensorData(tensor.get()), data.data(), data.size());
  return tensor;
}

// Frees the strings FromProto copied into a TF_STRING tensor (TF_DeleteTensor frees only the array).
void ReleaseStrings(TF_Tensor* tensor) {
  if (TF_TensorType(tensor) != TF_STRING) return;
  auto* strings = static_cast<TF_TString*>(TF_TensorData(tensor));
  for (size_t i = 0; i < TF_TensorByteSize(tensor) / sizeof(TF_TString); ++i) TF_StringDealloc(&strings[i]);
}

tensorflow::TensorProto ToProto(const TF_Tensor* tensor) {
  tensorflow::TensorProto proto;
  proto.set_dtype(static_cast<tensorflow::DataType>(TF_TensorType(tensor)));
  for (int i = 0; i < TF_NumDims(tensor); ++i) proto.mutable_tensor_shape()->add_dim()->set_size(TF_Dim(tensor, i));
  proto.set_tensor_content(TF_TensorData(tensor), TF_TensorByteSize(tensor));
  return proto;
}

void RunRequest(TF_Session* session, TF_Graph* graph, const tensorflow::MetaGraphDef& meta_graph,
                const std::string& request_dir) {
  std::string key = ReadFile(request_dir + "/signature");
  key.erase(key.find_last_not_of(" \n") + 1);
  const auto signature = meta_graph.signature_def().find(key);
  if (signature == meta_graph.signature_def().end()) throw std::runtime_error("no signature " + key);

  std::vector<TF_Output> feeds;
  std::vector<Tensor> inputs;
  for (const auto& [name, info] : signature->second.inputs()) {
    tensorflow::TensorProto proto;
    const std::string path = request_dir + "/" + name + ".pb";
    if (!proto.ParseFromString(ReadFile(path))) throw std::runtime_error(path + " is not a TensorProto");
    inputs.push_back(FromProto(proto, path));
    feeds.push_back(GraphTensor(graph, info.name()));
  }
  std::vector<std::string> output_keys;
  std::vector<TF_Output> fetches;
  for (const auto& [name, info] : signature->second.outputs()) {
    output_keys.push_back(name);
    fetches.push_back(GraphTensor(graph, info.name()));
  }

  std::vector<TF_Tensor*> input_values;
  for (const auto& t : inputs) input_values.push_back(t.get());
  std::vector<TF_Tensor*> output_values(fetches.size(), nullptr);
  Status status(TF_NewStatus());
  TF_SessionRun(session, nullptr, feeds.data(), input_values.data(), static_cast<int>(feeds.size()),
                fetches.data(), output_values.data(), static_cast<int>(fetches.size()), nullptr, 0, nullptr,
                status.get());
  std::vector<Tensor> outputs(output_values.begin(), output_values.end());  // owned from here on
  for (const auto& t : inputs) ReleaseStrings(t.get());
  Check(status.get(), "running " + key + " on " + request_dir);
  for (size_t i = 0; i < outputs.size(); ++i) {
    WriteFile(request_dir + "/" + output_keys[i] + ".out.pb", ToProto(outputs[i].get()).SerializeAsString());
  }
  std::printf("%s: %s, %zu outputs\n", request_dir.c_str(), key.c_str(), outputs.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s OP_LIBRARY SAVED_MODEL_DIR REQUEST_DIR...\n", argv[0]);
    return 2;
  }
  try {
    Status status(TF_NewStatus());
    TF_Library* library = TF_LoadLibrary(argv[1], status.get());  // kept loaded for the process
    Check(status.get(), std::string("loading the op library ") + argv[1]);
    (void)library;

    std::unique_ptr<TF_Graph, Deleter<TF_Graph, TF_DeleteGraph>> graph(TF_NewGraph());
    std::unique_ptr<TF_SessionOptions, Deleter<TF_SessionOptions, TF_DeleteSessionOptions>> options(
        TF_NewSessionOptions());
    std::unique_ptr<TF_Buffer, Deleter<TF_Buffer, TF_DeleteBuffer>> meta_graph_buffer(TF_NewBuffer());
    const char* tags[] = {"serve"};
    TF_Session* session = TF_LoadSessionFromSavedModel(options.get(), nullptr, argv[2], tags, 1, graph.get(),
                                                       meta_graph_buffer.get(), status.get());
    Check(status.get(), std::string("loading the SavedModel ") + argv[2]);
    tensorflow::MetaGraphDef meta_graph;
    if (!meta_graph.ParseFromArray(meta_graph_buffer->data, static_cast<int>(meta_graph_buffer->length))) {
      throw std::runtime_error("the loader returned an unreadable MetaGraphDef");
    }
    for (int i = 3; i < argc; ++i) RunRequest(session, graph.get(), meta_graph, argv[i]);
    TF_CloseSession(session, status.get());
    TF_DeleteSession(session, status.get());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
  return 0;
}
