// Lets vLLM 0.32's DeepGEMM extension (vllm/third_party/deep_gemm/_C_extension.abi3.so, built
// against torch 2.13) load into torch 2.11 (the H200 host's torch). `nm -D --undefined-only` of
// the extension against torch 2.11's exports finds exactly five torch symbols missing; this
// library defines them, forwarding to torch 2.11's equivalents where they exist:
//   c10::ValueError::ValueError(SourceLocation, std::string)   2.11: inherited, inline only
//   torch::Library::_def(FunctionSchema&&, OperatorName*, vector<headeronly::Tag> const&, _RegisterOrVerify) &
//   torch::Library::_def(variant<OperatorName, FunctionSchema>&&, CppFunction&&, vector<headeronly::Tag> const&) &
//   torch_exception_get_what(), torch_exception_get_what_without_backtrace()   2.13 stable C
//     API, read only when a stable-API call has already failed: torch 2.11 keeps no such text
//     (it logs the exception itself), so they return a pointer to a fixed explanation.
// 2.13 moved at::Tag to torch::headeronly::Tag and added two tags (inplace, out), which shifts
// the enum values: tags are translated by name, and the two 2.11 lacks are dropped.
// Built by staging/build_vllm032.sh against torch 2.11's headers; linked into the extension with
// `patchelf --add-needed`. Nothing else of the extension's ABI is touched.
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <new>
#include <string>
#include <variant>
#include <vector>

namespace {
// torch 2.13's headeronly::Tag, in its declaration order; -1: not in torch 2.11.
const int kTag213To211[] = {
    static_cast<int>(at::Tag::core), static_cast<int>(at::Tag::cudagraph_unsafe),
    static_cast<int>(at::Tag::data_dependent_output), static_cast<int>(at::Tag::dynamic_output_shape),
    static_cast<int>(at::Tag::flexible_layout), static_cast<int>(at::Tag::generated),
    -1 /* inplace */, static_cast<int>(at::Tag::inplace_view),
    static_cast<int>(at::Tag::maybe_aliasing_or_mutating),
    static_cast<int>(at::Tag::needs_contiguous_strides), static_cast<int>(at::Tag::needs_exact_strides),
    static_cast<int>(at::Tag::needs_fixed_stride_order),
    static_cast<int>(at::Tag::nondeterministic_bitwise),
    static_cast<int>(at::Tag::nondeterministic_seeded), -1 /* out */,
    static_cast<int>(at::Tag::out_variant), static_cast<int>(at::Tag::pointwise),
    static_cast<int>(at::Tag::pt2_compliant_tag), static_cast<int>(at::Tag::reduction),
    static_cast<int>(at::Tag::view_copy)};

std::vector<at::Tag> translate(const std::vector<int>& tags213) {
  std::vector<at::Tag> out;
  for (int t : tags213) {
    if (t >= 0 && t < static_cast<int>(sizeof(kTag213To211) / sizeof(int)) && kTag213To211[t] >= 0)
      out.push_back(static_cast<at::Tag>(kTag213To211[t]));
  }
  return out;
}
}  // namespace

extern "C" {
// torch 2.11's private Library::_def overloads, by their mangled names.
torch::Library& wcp_def_schema_211(torch::Library* self, c10::FunctionSchema&& schema,
                                   c10::OperatorName* out_name, const std::vector<at::Tag>& tags,
                                   torch::_RegisterOrVerify rv)
    __asm__("_ZNR5torch7Library4_defEON3c1014FunctionSchemaEPNS1_12OperatorNameERKSt6vectorIN2at3TagESaIS8_EENS_17_RegisterOrVerifyE");
torch::Library& wcp_def_fn_211(torch::Library* self,
                               std::variant<c10::OperatorName, c10::FunctionSchema>&& name,
                               torch::CppFunction&& f, const std::vector<at::Tag>& tags)
    __asm__("_ZNR5torch7Library4_defEOSt7variantIJN3c1012OperatorNameENS2_14FunctionSchemaEEEONS_11CppFunctionERKSt6vectorIN2at3TagESaISB_EE");

// The torch 2.13 names the extension asks for (headeronly::Tag has the layout of an int).
torch::Library& wcp_def_schema_213(torch::Library* self, c10::FunctionSchema&& schema,
                                   c10::OperatorName* out_name, const std::vector<int>& tags,
                                   torch::_RegisterOrVerify rv)
    __asm__("_ZNR5torch7Library4_defEON3c1014FunctionSchemaEPNS1_12OperatorNameERKSt6vectorINS_10headeronly3TagESaIS8_EENS_17_RegisterOrVerifyE");
torch::Library& wcp_def_fn_213(torch::Library* self,
                               std::variant<c10::OperatorName, c10::FunctionSchema>&& name,
                               torch::CppFunction&& f, const std::vector<int>& tags)
    __asm__("_ZNR5torch7Library4_defEOSt7variantIJN3c1012OperatorNameENS2_14FunctionSchemaEEEONS_11CppFunctionERKSt6vectorINS_10headeronly3TagESaISB_EE");
void wcp_value_error_ctor(c10::ValueError* self, c10::SourceLocation loc, std::string msg)
    __asm__("_ZN3c1010ValueErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE");
}

torch::Library& wcp_def_schema_213(torch::Library* self, c10::FunctionSchema&& schema,
                                   c10::OperatorName* out_name, const std::vector<int>& tags,
                                   torch::_RegisterOrVerify rv) {
  return wcp_def_schema_211(self, std::move(schema), out_name, translate(tags), rv);
}

torch::Library& wcp_def_fn_213(torch::Library* self,
                               std::variant<c10::OperatorName, c10::FunctionSchema>&& name,
                               torch::CppFunction&& f, const std::vector<int>& tags) {
  return wcp_def_fn_211(self, std::move(name), std::move(f), translate(tags));
}

void wcp_value_error_ctor(c10::ValueError* self, c10::SourceLocation loc, std::string msg) {
  new (self) c10::ValueError(loc, std::move(msg));
}

extern "C" {
const char* torch_exception_get_what() {
  return "exception text unavailable: torch 2.11 does not keep it for the stable C API "
         "(see the error logged just above)";
}
const char* torch_exception_get_what_without_backtrace() { return torch_exception_get_what(); }
}
