#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "data/series_stages.hpp"
#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/io/csv.hpp"

namespace seqforge::series {

namespace {
// One cell typed two ways ("rain" and "Rain ") makes two categories: said, not merged.
void note_categories_alike(const std::string& path, const std::string& column, const char* key,
                           const std::vector<std::string>& categories, SeriesData* d) {
  if (const std::string alike = io::names_alike(categories); !alike.empty())
    d->notes.push_back(path + ": categories " + alike + " in column " + io::quoted(column) + " (" +
                       key +
                       ") differ only in case, spaces or how a number is written: each is a "
                       "category of its own");
}
}  // namespace

void static_categories(const DataFile& table, const DataOptions& opt, const RowOrder& order,
                       const SeriesData* stored, SeriesData* d) {
  const SeriesOptions& o = opt.series;
  if (!o.statics.empty() && table.is_array())
    fail(opt.where("data.static"), ": data.static: ", opt.path,
         " is an array; static categories are a CSV's");
  if (stored && stored->static_categories.size() != o.statics.size())
    fail(opt.where("data.static"), ": data.static names ", o.statics.size(),
         " columns; the model was trained on ", stored->static_categories.size());
  for (size_t i = 0; i < o.statics.size(); ++i) {
    const std::string& column = o.statics[i];
    if (stored && stored->static_categories[i].first != column)
      fail(opt.where("data.static"), ": data.static names '", column,
           "' where the model was trained on '", stored->static_categories[i].first, "'");
    if (!table.has_column(column))
      fail(opt.where("data.static"), ": data.static: ", opt.path, " has no column '", column, "'",
           table.columns_hint(column));
    const io::CsvColumn& text = table.text(column);
    table.check_utf8(column, "data.static");
    std::vector<std::string> values;  // per series
    for (const SeriesSpan& s : order.spans) {
      const int64_t first = order.rows[s.begin];
      if (text[first].empty())
        fail(table.where(first), ": column '", column, "' (data.static) is empty");
      for (int64_t p = s.begin + 1; p < s.end; ++p)
        if (text[order.rows[p]] != text[first])
          fail(table.where(order.rows[p]), ": column '", column, "' (data.static) is '",
               text[order.rows[p]], "' where ", table.where(first), " of the same series has '",
               text[first], "': a static column holds one value per series");
      values.emplace_back(text[first]);
    }
    std::vector<std::string> categories = values;
    if (stored) {
      categories = stored->static_categories[i].second;
      for (size_t k = 0; k < values.size(); ++k)
        if (!std::binary_search(categories.begin(), categories.end(), values[k]))
          fail(opt.path, ": ",
               order.spans[k].name.empty() ? "the series"
                                           : "series " + io::quoted(order.spans[k].name),
               " has ", column, " '", values[k],
               "', which the model was not trained on (data.static)",
               io::known_otherwise(values[k], categories));
    } else {
      std::sort(categories.begin(), categories.end());
      categories.erase(std::unique(categories.begin(), categories.end()), categories.end());
      note_categories_alike(opt.path, column, "data.static", categories, d);
    }
    d->static_categories.emplace_back(column, std::move(categories));
  }
}

void categorical_columns(const DataFile& table, const DataOptions& opt, const SeriesData* stored,
                         const CategorySet& left_out, SeriesData* d) {
  const SeriesOptions& o = opt.series;
  constexpr size_t kMaxCategories = 256;
  if (!o.categorical.empty() && table.is_array())
    fail(opt.where("data.categorical"), ": data.categorical: ", opt.path,
         " is an array; categorical columns are a CSV's");
  if (stored && stored->categories.size() != o.categorical.size())
    fail(opt.where("data.categorical"), ": data.categorical names ", o.categorical.size(),
         " columns; the model was trained on ", stored->categories.size());
  for (size_t i = 0; i < o.categorical.size(); ++i) {
    const std::string& column = o.categorical[i];
    if (stored && stored->categories[i].first != column)
      fail(opt.where("data.categorical"), ": data.categorical names '", column,
           "' where the model was trained on '", stored->categories[i].first, "'");
    if (!table.has_column(column))
      fail(opt.where("data.categorical"), ": data.categorical: ", opt.path, " has no column '",
           column, "'", table.columns_hint(column));
    for (const std::string* other : {&o.date_col, &o.series_col, &o.class_col})
      if (column == *other)
        fail(opt.where("data.categorical"), ": data.categorical: '", column,
             "' is the date, series or class column, which cannot be a feature");
    using Names = const std::vector<std::string>*;
    for (Names names : {Names{&d->feature_names}, Names{&o.targets}, Names{&o.statics}})
      if (std::find(names->begin(), names->end(), column) != names->end())
        fail(opt.where("data.categorical"), ": data.categorical: '", column,
             "' is also a feature, a target or a static column (data.features, data.targets, "
             "data.static): a column is one of them");
    const io::CsvColumn& text = table.text(column);
    table.check_utf8(column, "data.categorical");
    if (stored) {
      const std::vector<std::string>& known = stored->categories[i].second;
      std::map<std::string, int64_t, std::less<>> unseen;
      for (const std::string_view v : text)
        if (!table.is_missing(v) && !std::binary_search(known.begin(), known.end(), v)) {
          const auto it = unseen.find(v);
          ++(it != unseen.end() ? it->second : unseen[std::string(v)]);
        }
      for (const auto& [value, rows] : unseen)
        d->notes.push_back(std::to_string(rows) + (rows == 1 ? " row has " : " rows have ") +
                           column + " '" + value +
                           "', which the model was not trained on (data.categorical)" +
                           io::known_otherwise(value, known) + ": all its one-hot features 0");
      d->categories.emplace_back(column, known);
      continue;
    }
    std::set<std::string, std::less<>> distinct;
    for (const std::string_view v : text)
      if (!table.is_missing(v) && !distinct.contains(v)) distinct.emplace(v);
    if (distinct.empty())
      fail(opt.path, ": column '", column,
           "' (data.categorical) holds no category: every cell is empty");
    std::vector<std::string> categories;
    for (const std::string& category : distinct)
      if (!left_out.contains({column, category})) categories.push_back(category);
    if (categories.size() > kMaxCategories)
      fail(opt.path, ": column '", column, "' (data.categorical) holds ", categories.size(),
           " categories, more than the ", kMaxCategories,
           " that one-hot features take (an identifier, or free text?)");
    note_categories_alike(opt.path, column, "data.categorical", categories, d);
    d->categories.emplace_back(column, std::move(categories));
  }
}

}  // namespace seqforge::series
